"""``flink-agents-replay waits list|decide``: folding wait events, the table, the decision record and the errors
(one line, exit code 2, no traceback). Kafka is faked: ``read_wait_events`` and ``send_decision`` are replaced."""

from __future__ import annotations

import json
import socket

import pytest

from flink_agents_replay.cli import main, waits
from flink_agents_replay.flink.signals import Signal, parse_signal
from flink_agents_replay.flink.waits import WaitEvent
from flink_agents_replay.jobs.waits_topic import wait_event_json
from flink_agents_replay.storage.records.waits import Decision

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def opened(wait_id: str, key: str, n: int, *, at: int = T0, deadline: int | None = T0 + 3_600_000) -> str:
    return wait_event_json(WaitEvent("opened", key, wait_id, "refunds", "refund", 1, "refund-approval",
                                     {"reference": f"{key}/{n}", "n": n}, deadline, at))


def event(kind: str, key: str, wait_id: str | None, **fields) -> str:
    return wait_event_json(WaitEvent(kind, key, wait_id, "refunds", **fields))


APPROVED = Decision(approved=True, by="ana", decided_at_ms=T0 + 5)
EVENTS = [
    event("decision_early", "c3", "w3", decision=APPROVED),  # before its wait opened: normal after a failover
    opened("w1", "c1", 1, at=T0 + 2000),
    opened("w2", "c2", 2, at=T0 + 1000, deadline=None),
    opened("w3", "c3", 3, at=T0 + 3000),
    event("resumed", "c3", "w3", decision=APPROVED),
    opened("w4", "c1", 4, at=T0 + 4000),
    event("resumed", "c1", "w4", decision=Decision(timed_out=True, by="timeout")),
    event("closed", "c1", "w4"),
    event("decision_rejected", "c9", None, payload="not a decision", reason="a decision needs a wait_id"),
]


@pytest.fixture
def topic(monkeypatch):
    """The waits topic's records (``records``, change at will) as ``read_wait_events`` returns them; the decisions
    sent, as ``sent``."""

    class Topic:
        records = [value.encode() for value in EVENTS]
        sent: list = []
        reads = 0

    def read(kafka, name, *, timeout_s):
        assert name == "waits" and kafka.bootstrap_servers == "kafka.example:9092"
        Topic.reads += 1
        return list(Topic.records)

    def send(kafka, name, record, *, timeout_s):
        Topic.sent.append((name, record))
        return 0, 41

    Topic.sent = []
    monkeypatch.setattr(waits, "read_wait_events", read)
    monkeypatch.setattr(waits, "send_decision", send)
    return Topic


KAFKA = ["--bootstrap-servers", "kafka.example:9092"]


# -- the fold -----------------------------------------------------------------------------------------------------
def test_a_wait_is_pending_from_opened_until_resumed_or_closed():
    folded = waits.fold_wait_events(EVENTS)
    assert folded.events == len(EVENTS) and folded.skipped == 0
    assert set(folded.waits) == {"w1", "w2", "w3", "w4"}  # the rejected decision belongs to no wait
    assert {w.wait_id for w in folded.waits.values() if w.pending} == {"w1", "w2"}
    w3, w4 = folded.waits["w3"], folded.waits["w4"]
    assert (w3.state, w3.last_kind, w3.decision["by"]) == ("resumed", "resumed", "ana")
    assert (w4.state, w4.decision["timed_out"]) == ("closed", True)
    w1 = folded.waits["w1"]
    assert (w1.key, w1.name, w1.payload, w1.opened_at_ms, w1.agent) == ("c1", "refund-approval",
                                                                        {"reference": "c1/1", "n": 1}, T0 + 2000,
                                                                        "refunds")


def test_after_compaction_a_waits_last_event_alone_still_says_where_it_is():
    """A compacted topic keeps each wait's last event: a duplicate decision after the close is all that is left."""
    folded = waits.fold_wait_events([event("decision_ignored", "c1", "w1", decision=APPROVED,
                                           reason="the wait already has a decision"), opened("w2", "c2", 2)])
    assert folded.waits["w1"].state is None and not folded.waits["w1"].pending
    assert folded.waits["w1"].last_kind == "decision_ignored"
    assert [w.wait_id for w in waits.selected(folded)] == ["w2"]


def test_records_that_are_not_wait_events_of_this_version_are_skipped_and_counted():
    later = json.dumps({**json.loads(opened("w9", "c9", 9)), "v": 2})
    folded = waits.fold_wait_events([b"not json", b"\xff\xfe", b"[1, 2]", later, opened("w1", "c1", 1).encode()])
    assert (folded.skipped, folded.events, set(folded.waits)) == (4, 1, {"w1"})


def test_pending_waits_come_oldest_first_and_filter_by_key():
    folded = waits.fold_wait_events(EVENTS)
    assert [w.wait_id for w in waits.selected(folded)] == ["w2", "w1"]
    assert [w.wait_id for w in waits.selected(folded, key="c1")] == ["w1"]
    assert [w.wait_id for w in waits.selected(folded, key="c1", everything=True)] == ["w1", "w4"]
    assert [w.wait_id for w in waits.selected(folded, everything=True)] == ["w2", "w1", "w3", "w4"]


# -- the table ----------------------------------------------------------------------------------------------------
def test_the_table_shows_id_key_name_payload_and_times_in_utc():
    folded = waits.fold_wait_events(EVENTS)
    lines = waits.format_waits(waits.selected(folded)).splitlines()
    assert lines[0].split() == ["WAIT", "ID", "KEY", "NAME", "PAYLOAD", "OPENED", "AT", "DEADLINE"]
    assert lines[1].split()[:3] == ["w2", "c2", "refund-approval"]
    assert lines[1].endswith("2026-01-01T00:00:01Z  -")  # no deadline
    assert lines[2].endswith("2026-01-01T00:00:02Z  2026-01-01T01:00:00Z")
    assert '{"n": 1, "reference": "c1/1"}' in lines[2]
    assert lines[2].index('{"n": 1') == lines[0].index("PAYLOAD")  # the columns line up


def test_a_long_payload_is_shortened_on_one_line():
    wait = waits.WaitState("w1", "c1", name="approve:pay", payload={"text": "line\n" * 40}, opened_at_ms=T0)
    row = waits.format_waits([wait]).splitlines()[1]
    shown = row.split("approve:pay", 1)[1].strip().split("  ")[0]
    assert len(shown) == waits.PAYLOAD_SHOWN and shown.endswith("...") and "\n" not in row


def test_all_adds_the_last_kind():
    folded = waits.fold_wait_events(EVENTS)
    table = waits.format_waits(waits.selected(folded, everything=True), everything=True)
    assert table.splitlines()[0].endswith("LAST KIND")
    assert [line.split()[-1] for line in table.splitlines()[1:]] == ["opened", "opened", "resumed", "closed"]


# -- waits list ---------------------------------------------------------------------------------------------------
def test_waits_list_prints_the_pending_waits(topic, capsys):
    assert main(["waits", "list", "--waits-topic", "waits", *KAFKA]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:3]] == ["w2", "w1"]
    assert out[-1] == f"2 pending waits (4 in all, from {len(EVENTS)} events of waits)"


def test_waits_list_all_json_and_key(topic, capsys):
    assert main(["waits", "list", "--waits-topic", "waits", "--all", "--json", "--key", "c1", *KAFKA]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(w["wait_id"], w["state"], w["pending"]) for w in shown] == [("w1", "opened", True),
                                                                        ("w4", "closed", False)]
    assert shown[0]["payload"] == {"reference": "c1/1", "n": 1} and shown[1]["decision"]["timed_out"] is True


def test_waits_list_says_so_when_it_skipped_records(topic, capsys):
    topic.records = [b"garbage", opened("w1", "c1", 1).encode()]
    assert main(["waits", "list", "--waits-topic", "waits", *KAFKA]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 record(s) of waits" in captured.err
    assert captured.out.splitlines()[-1] == "1 pending wait (1 in all, from 1 events of waits)"


# -- waits decide -------------------------------------------------------------------------------------------------
def test_waits_decide_sends_a_decision_keyed_by_the_waits_key(topic, capsys):
    assert main(["waits", "decide", "w1", "--approve", "--reason", "fine", "--value", '{"amount": 80}', "--by", "ana",
                 "--signals-topic", "signals", "--waits-topic", "waits", *KAFKA]) == 0
    [(name, record)] = topic.sent
    assert name == "signals" and record["key"] == "c1"
    assert len(record["signal_id"]) == 32 and isinstance(record["sent_at_ms"], int)
    signal = parse_signal("c1", json.dumps(record))
    assert signal == Signal("c1", "w1", Decision(approved=True, value={"amount": 80}, reason="fine", by="ana",
                                                 decided_at_ms=record["sent_at_ms"]), record["signal_id"])
    assert "approved wait w1 (key 'c1')" in capsys.readouterr().out


def test_waits_decide_with_a_key_does_not_read_the_waits_topic(topic):
    assert main(["waits", "decide", "w7", "--deny", "--key", "c7", "--signals-topic", "signals", *KAFKA]) == 0
    [(_, record)] = topic.sent
    assert topic.reads == 0
    assert (record["key"], record["wait_id"], record["approved"]) == ("c7", "w7", False)
    assert "value" not in record and "reason" not in record and "by" not in record
    assert parse_signal("c7", record).decision == Decision(approved=False, decided_at_ms=record["sent_at_ms"])


def test_two_decisions_get_two_signal_ids():
    first, second = (waits.decision_record("c1", "w1", approved=True) for _ in range(2))
    assert first["signal_id"] != second["signal_id"]


def test_a_null_value_is_a_value():
    record = waits.decision_record("c1", "w1", approved=True, value=None, with_value=True)
    assert "value" in record and record["value"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (["decide", "nope", "--approve", "--waits-topic", "waits"], "unknown wait id 'nope'"),
    (["decide", "w3", "--approve", "--waits-topic", "waits"], "wait w3 is resumed already"),
    (["decide", "w4", "--deny", "--waits-topic", "waits"], "wait w4 is closed already"),
    (["decide", "w1", "--approve", "--key", "c1", "--value", "{bad"], "--value '{bad' is not JSON"),
    (["decide", "w1", "--approve", "--key", "c1", "--value", "NaN"], "--value 'NaN' is not JSON"),
    (["decide", "w1", "--approve", "--key", "c1", "-X", "nonsense"], "-X 'nonsense'"),
])
def test_decide_errors_are_one_line_with_exit_code_2(topic, capsys, argv, message):
    assert main(["waits", *argv, "--signals-topic", "signals", *KAFKA]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"flink-agents-replay: {message}"), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert topic.sent == []


@pytest.mark.parametrize("argv", [
    ["decide", "w1", "--signals-topic", "s", "--key", "c1"],  # neither --approve nor --deny
    ["decide", "w1", "--approve", "--deny", "--signals-topic", "s", "--key", "c1"],
    ["decide", "w1", "--approve", "--signals-topic", "s"],  # neither --waits-topic nor --key
    ["decide", "w1", "--approve", "--signals-topic", "s", "--key", "c1", "--waits-topic", "w"],
    ["decide", "w1", "--approve", "--key", "c1"],  # no --signals-topic
    ["list"],  # no --waits-topic
])
def test_argument_errors_are_usage_errors(topic, capsys, argv):
    with pytest.raises(SystemExit) as exited:
        main(["waits", *argv])
    assert exited.value.code == 2 and "usage:" in capsys.readouterr().err
    assert topic.sent == []


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("argv", [
    ["list", "--waits-topic", "waits"],
    ["decide", "w1", "--approve", "--signals-topic", "signals", "--key", "c1"],
])
def test_no_broker_is_one_line_with_exit_code_2(capsys, argv):
    """No fake here: nothing listens on the port, and the real clients give up after --timeout-s."""
    assert main(["waits", *argv, "--bootstrap-servers", f"127.0.0.1:{_closed_port()}", "--timeout-s", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flink-agents-replay: could not reach Kafka at 127.0.0.1:") and err.count("\n") == 1, err
