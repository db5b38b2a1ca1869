"""The replay diff: which runs it compares, how it classifies them, and how it reports them."""

import json

from flink_agents_replay.replay.diff import (
    NOTE_NO_PRODUCTION_RUN,
    NOTE_REPLAY_NOT_FINISHED,
    BlockedCallEntry,
    compare,
    to_json_value,
)
from flink_agents_replay.storage.capture.records import BlockedCall, CapturedInput, CapturedOutput, CapturedRun


def run(key, seq, *outputs, blocked=(), error=None, digest="d"):
    return CapturedRun(key, seq, digest, outputs=[CapturedOutput(f"ev-{key}-{seq}-{i}", o) for i, o in
                                                  enumerate(outputs)], blocked=list(blocked), error=error)


def inp(key, seq, digest="d"):
    return CapturedInput(key, seq, None, {"text": f"{key}/{seq}"}, digest)


def by_seq(report):
    return {(run.key, run.seq): run for run in report.runs}


def test_each_status():
    production = [run("a", 1, "x"), run("a", 2, "x"), run("a", 3), run("a", 4, "x"), run("a", 5)]
    replay = [run("a", 1, "x"), run("a", 2, "y"), run("a", 3, "z"), run("a", 4), run("a", 5)]
    report = compare(production, replay, [inp("a", s) for s in range(1, 6)])
    assert [(r.seq, r.status) for r in report.runs] == [
        (1, "same"), (2, "changed"), (3, "new"), (4, "missing"), (5, "same")]
    changed = by_seq(report)[("a", 2)]
    assert (changed.production, changed.replay, changed.note) == (["x"], ["y"], None)
    assert report.summary == {"compared": 5, "same": 2, "changed": 1, "new": 1, "missing": 1, "waiting": 0,
                              "blocked_calls": 0, "errors": 0, "waits": 0, "decisions_changed": 0}


def test_event_ids_are_not_compared():
    production = CapturedRun("k", 1, "d", outputs=[CapturedOutput("prod-id", {"a": 1})])
    replay = CapturedRun("k", 1, "d", outputs=[CapturedOutput("other-id", {"a": 1})])
    assert compare([production], [replay], []).runs[0].status == "same"


def test_last_record_wins_on_every_side():
    production = [run("k", 1, "old"), run("k", 1, "v")]
    replay = [run("k", 1, "stale"), run("k", 1, "v")]
    report = compare(production, replay, [inp("k", 1), inp("k", 1)])
    assert len(report.runs) == 1
    assert (report.runs[0].status, report.runs[0].production, report.runs[0].replay) == ("same", ["v"], ["v"])


def test_production_runs_outside_the_replayed_set_are_ignored():
    production = [run("k", 1, "v"), run("k", 2, "later"), run("other", 1, "elsewhere")]
    report = compare(production, [run("k", 1, "v")], [inp("k", 1)])
    assert [(r.key, r.seq) for r in report.runs] == [("k", 1)]
    assert not report.has_differences


def test_keys_are_matched_by_digest_so_int_and_str_keys_differ():
    report = compare([run(1, 1, "int-key")], [run("1", 1, "str-key")], [])
    assert [(r.key, r.status, r.note) for r in report.runs] == [("1", "new", NOTE_NO_PRODUCTION_RUN)]


def test_replay_input_without_run_is_missing_with_note():
    report = compare([run("k", 1, "v")], [], [inp("k", 1)])
    only = report.runs[0]
    assert (only.status, only.production, only.replay, only.note) == ("missing", ["v"], [], NOTE_REPLAY_NOT_FINISHED)
    assert report.has_differences


def test_replay_run_without_production_run_is_new_with_note():
    only = compare([], [run("k", 1, "v")], [inp("k", 1)]).runs[0]
    assert (only.status, only.production, only.note) == ("new", [], NOTE_NO_PRODUCTION_RUN)


def test_different_input_digests_are_noted():
    only = compare([run("k", 1, "v", digest="a")], [run("k", 1, "v", digest="b")], []).runs[0]
    assert only.status == "same" and "different digests" in only.note


def test_error_is_kept():
    report = compare([run("k", 1)], [run("k", 1, error="ValueError('boom')")], [inp("k", 1)])
    only = report.runs[0]
    assert (only.status, only.error) == ("same", "ValueError('boom')")
    assert report.summary["errors"] == 1
    assert report.errors == [only]
    assert "ValueError('boom')" in report.render_text()


def test_blocked_calls_are_listed_with_arguments():
    blocked = BlockedCall("ev1", "notify", 0, "email", "(('ops@example.com',), {'urgent': True})")
    report = compare([run("k", 1, "sent")], [run("k", 1, "sent", blocked=[blocked])], [inp("k", 1)])
    assert report.blocked_calls == [BlockedCallEntry("k", 1, "ev1", "notify", 0, "email", blocked.arguments)]
    assert report.summary["blocked_calls"] == 1
    text = report.render_text()
    assert "email" in text and "ops@example.com" in text
    assert report.to_json()["blocked_calls"][0]["arguments"] == blocked.arguments


def test_to_json_round_trips_through_json_dumps():
    class Opaque:
        def __repr__(self):
            return "Opaque()"

    odd = {"obj": Opaque(), 3: (1, 2), "nan": float("nan"), "nested": [{"b": None, "t": True}]}
    report = compare([run("k", 1, odd)], [run("k", 1, "plain")], [inp("k", 1)])
    doc = report.to_json()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert doc["runs"][0]["production"] == [
        {"obj": "Opaque()", "3": [1, 2], "nan": "nan", "nested": [{"b": None, "t": True}]}]
    assert doc["summary"]["changed"] == 1


def test_to_json_value_survives_cycles_and_broken_repr():
    cyclic = []
    cyclic.append(cyclic)

    class Broken:
        def __repr__(self):
            raise RuntimeError("no")

    converted = to_json_value([cyclic, Broken()])
    json.dumps(converted)
    assert converted[0] == ["[[...]]"] and "repr failed" in converted[1]


def test_render_text_shows_counts_and_differing_rows_only():
    production = [run("same-key", 1, "equal"), run("diff-key", 1, "before")]
    replay = [run("same-key", 1, "equal"), run("diff-key", 1, "after" * 100)]
    report = compare(production, replay, [inp("same-key", 1), inp("diff-key", 1)])
    text = report.render_text(max_width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    summary_lines = {line.split()[0]: line.split()[1] for line in text.splitlines()
                     if line.split()[:1] and line.split()[0] in ("compared", "same", "changed")}
    assert summary_lines == {"compared": "2", "same": "1", "changed": "1"}
    assert "diff-key" in text and '["before"]' in text and "…" in text
    assert "same-key" not in text


def test_render_html_is_one_escaped_page():
    report = compare([run("<k>", 1, "<script>alert(1)</script>")], [run("<k>", 1, "fine & dandy")], [inp("<k>", 1)])
    page = report.render_html()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<html") == 1 and page.rstrip().endswith("</html>")
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;k&gt;" in page and "fine &amp; dandy" in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch


def test_has_differences_is_false_when_everything_matches():
    report = compare([run("k", 1, "v"), run("k", 2)], [run("k", 1, "v"), run("k", 2)], [inp("k", 1), inp("k", 2)])
    assert not report.has_differences
    assert "none" in report.render_text()
