"""Unit tests of the replay building blocks (no Kafka, no Flink): side-effect policies, savepoint metadata,
capture manifest entries, replay isolation in the agent config, and ``execute_run`` in replay mode."""

import copy
import dataclasses
import struct

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import SideEffects, Tool, current_call_id
from flink_agents_replay.core.errors import CallBlocked, ConfigError, ReplayConfigError, ReplayIsolationError
from flink_agents_replay.engine import FingerprintPolicy, RunInput, execute_run
from flink_agents_replay.flink.config import (
    DEFAULT_CAPTURE_RETENTION_MS,
    AgentConfig,
    default_journal_topic,
    default_uid,
)
from flink_agents_replay.replay.gate import ReplayCalls
from flink_agents_replay.replay.policy import CallPolicy, default_policy, parse_policies, policy_for
from flink_agents_replay.replay.savepoint import operator_id, read_savepoint
from flink_agents_replay.replay.settings import ReplaySettings
from flink_agents_replay.storage.capture.manifest import CaptureDescription, ManifestEntry, manifest_topic
from flink_agents_replay.storage.capture.records import BlockedCall
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import CallOutcome, key_digest
from flink_agents_replay.storage.records.raised import decode_exception

KEY_GROUP = 2
SIGNING_KEY = b"0123456789abcdef0123"


# --- side-effect policies ------------------------------------------------------------------------------------------

def replay_run(agent, run, memory, gate, **options):
    """A run under a replay's call gate, as the operator makes it: a failed run is reported, not raised."""
    return execute_run(agent, run, memory, gate=gate, report_failures=True, **options)



def _tool(side_effects):
    return Tool(lambda: None, side_effects=side_effects)


@pytest.mark.parametrize(("side_effects", "expected"), [
    ("none", CallPolicy.LIVE),
    ("idempotent", CallPolicy.LIVE),
    ("external", CallPolicy.BLOCKED),
])
def test_default_policy_follows_declared_side_effects(side_effects, expected):
    assert default_policy(_tool(side_effects)) is expected
    assert default_policy(_tool(SideEffects(side_effects))) is expected


class _ReadOnlyRemoteTool(Tool):
    """A tool whose server says it only reads, with a replay default of its own (as MCP tools have)."""

    replay_default = "blocked"


def test_a_resource_with_its_own_replay_default_is_blocked_unless_its_name_says_otherwise():
    remote = _ReadOnlyRemoteTool(lambda: None, side_effects="none")
    assert default_policy(remote) is CallPolicy.BLOCKED  # read-only by its annotations, blocked all the same
    assert policy_for("lookup", remote, parse_policies("*=live")) is CallPolicy.BLOCKED  # "*" does not reach it
    assert policy_for("lookup", remote, parse_policies("*=live,lookup=live")) is CallPolicy.LIVE
    assert policy_for("lookup", remote, parse_policies("lookup=recorded")) is CallPolicy.RECORDED


def test_parse_policies_from_dict_and_string_agree():
    from_dict = parse_policies({"llm": "recorded", "orders": CallPolicy.LIVE, "mail": "blocked"})
    from_string = parse_policies(" llm = recorded , orders=live,mail=blocked, ")
    expected = {"llm": CallPolicy.RECORDED, "orders": CallPolicy.LIVE, "mail": CallPolicy.BLOCKED}
    assert from_dict == expected
    assert from_string == expected
    assert all(isinstance(value, CallPolicy) for value in from_string.values())
    assert parse_policies(None) == {}
    assert parse_policies("") == {}


def test_policy_for_prefers_the_named_setting_then_the_wildcard_then_the_default():
    external, pure = _tool("external"), _tool("none")
    settings = parse_policies("*=recorded,mail=live")
    assert policy_for("mail", external, settings) is CallPolicy.LIVE
    assert policy_for("other", external, settings) is CallPolicy.RECORDED
    assert policy_for("other", pure, settings) is CallPolicy.RECORDED
    no_wildcard = parse_policies("mail=live")
    assert policy_for("other", external, no_wildcard) is CallPolicy.BLOCKED
    assert policy_for("other", pure, no_wildcard) is CallPolicy.LIVE
    assert policy_for("mail", external, {}) is CallPolicy.BLOCKED


@pytest.mark.parametrize("settings", [{"llm": "replayed"}, "llm=replayed", "llm=LIVE", {"llm": None}])
def test_bad_policy_value_is_a_config_error_naming_resource_and_choices(settings):
    with pytest.raises(ConfigError, match=r"side-effect policy of 'llm' must be one of \['live', 'recorded', "
                                          r"'blocked'\]"):
        parse_policies(settings)


@pytest.mark.parametrize("settings", ["llm", "llm=live,orders", "llm:live"])
def test_malformed_policy_string_is_a_config_error_showing_the_syntax(settings):
    with pytest.raises(ConfigError, match=r"name=policy\[,name=policy\.\.\.\], got") as caught:
        parse_policies(settings)
    assert repr(settings) in str(caught.value)


# --- savepoint metadata --------------------------------------------------------------------------------------------

UID = "flink-agents-replay/x"


def _write_metadata(directory, *, magic=0x4960672D, version=6, checkpoint_id=42, uid=UID):
    directory.mkdir(parents=True, exist_ok=True)
    body = struct.pack(">iiq", magic, version, checkpoint_id) + b"\x00\x01\x02" + operator_id(uid) + b"\xff" * 20
    (directory / "_metadata").write_bytes(body)
    return directory


def test_operator_id_matches_the_id_flink_wrote_in_a_real_savepoint():
    assert operator_id("tickets-source").hex() == "7d86e908a4b3c6857cfd37273c9b2691"
    assert len(operator_id(UID)) == 16
    assert operator_id(UID) != operator_id("flink-agents-replay/y")


@pytest.mark.parametrize("form", ["directory", "file", "file-uri", "file-uri-single-slash", "directory-string"])
def test_read_savepoint_reads_checkpoint_id_and_operators(tmp_path, form):
    savepoint = _write_metadata(tmp_path / "savepoint-abc")
    given = {
        "directory": savepoint,
        "directory-string": str(savepoint),
        "file": savepoint / "_metadata",
        "file-uri": f"file://{savepoint}",
        "file-uri-single-slash": f"file:{savepoint}",
    }[form]
    info = read_savepoint(given)
    assert info.checkpoint_id == 42
    assert info.version == 6
    assert info.path == savepoint
    assert info.holds_operator(UID)
    assert not info.holds_operator("flink-agents-replay/y")


def test_read_savepoint_refuses_a_wrong_magic_number(tmp_path):
    savepoint = _write_metadata(tmp_path / "sp", magic=0x12345678)
    with pytest.raises(ReplayConfigError, match=r"not a Flink savepoint's _metadata \(magic number 0x12345678\)"):
        read_savepoint(savepoint)


def test_read_savepoint_refuses_a_too_short_file(tmp_path):
    (tmp_path / "_metadata").write_bytes(struct.pack(">ii", 0x4960672D, 6))
    with pytest.raises(ReplayConfigError, match=r"too short"):
        read_savepoint(tmp_path)


@pytest.mark.parametrize("make_path", [
    lambda tmp: tmp / "missing",
    lambda tmp: f"file://{tmp}/missing",
    lambda tmp: tmp,  # a directory without _metadata
])
def test_read_savepoint_refuses_a_missing_path(tmp_path, make_path):
    with pytest.raises(ReplayConfigError, match=r"cannot read the savepoint's metadata .*flink savepoint"):
        read_savepoint(make_path(tmp_path))


# --- capture manifest ----------------------------------------------------------------------------------------------

DESCRIPTION = CaptureDescription(uid=UID, capture_topic="prod.capture", key_type="STRING", max_parallelism=8,
                                 codec_version=1, journal_topic="prod.journal", output_topics=("prod.out", "audit"))


def test_manifest_entry_round_trip_and_key_format():
    entry = ManifestEntry(17, {5: 100, 3: 7, 4: 0}, DESCRIPTION, subtask=2)
    key, value = entry.encode()
    assert key == b"17:3-5"
    decoded = ManifestEntry.decode(value)
    assert decoded == entry
    assert decoded.offsets == {3: 7, 4: 0, 5: 100}
    assert decoded.description.output_topics == ("prod.out", "audit")
    assert decoded.subtask == 2


def test_manifest_entry_of_one_partition_and_of_none():
    assert ManifestEntry(3, {6: 1}, DESCRIPTION).encode()[0] == b"3:6-6"
    key, value = ManifestEntry(3, {}, DESCRIPTION).encode()
    assert key == b"3:-"
    assert ManifestEntry.decode(value).offsets == {}


def test_manifest_entry_without_journal_round_trips():
    description = CaptureDescription(uid=UID, capture_topic="c", key_type="INT", max_parallelism=1, codec_version=1)
    entry = ManifestEntry(1, {0: 9}, description)
    assert ManifestEntry.decode(entry.encode()[1]) == entry


def test_manifest_decode_refuses_a_value_that_is_not_an_entry():
    with pytest.raises((ValueError, KeyError)):
        ManifestEntry.decode(b'{"checkpoint_id": 1}')
    with pytest.raises(ValueError):
        ManifestEntry.decode(b"not json")


def test_production_topics_are_capture_manifest_journal_and_outputs():
    assert manifest_topic("prod.capture") == "prod.capture.manifest"
    assert DESCRIPTION.production_topics == {"prod.capture", "prod.capture.manifest", "prod.journal", "prod.out",
                                             "audit"}
    without_journal = CaptureDescription(uid=UID, capture_topic="c", key_type="STRING", max_parallelism=1,
                                         codec_version=1)
    assert without_journal.production_topics == {"c", "c.manifest"}


# --- replay isolation in the agent config --------------------------------------------------------------------------

PRODUCTION = ReplaySettings(
    production_capture_topic="prod.capture",
    start_offsets={0: 0},
    production_journal_topic="prod.journal",
    production_topics=frozenset(DESCRIPTION.production_topics),
    policies={},
    checkpoint_id=42,
)


def _config(replay=PRODUCTION, **overrides):
    settings = {"kafka": {"bootstrap.servers": "x:1"}, "signing_key": "k" * 16, "capture": True,
                "journal_topic": "replay.journal", "capture_topic": "replay.capture", "output_topics": ["replay.out"],
                "replay": replay, **overrides}
    return AgentConfig(**settings)


def test_replay_with_its_own_topics_resolves():
    resolved = _config().resolved("agent")
    assert resolved.journal_topic == "replay.journal"
    assert resolved.capture_topic == "replay.capture"
    assert resolved.output_topics == ("replay.out",)
    assert resolved.replay is PRODUCTION


@pytest.mark.parametrize(("overrides", "role"), [
    ({"journal_topic": "prod.journal"}, "journal topic"),
    ({"capture_topic": "prod.capture"}, "capture topic"),
    ({"output_topics": ["replay.out", "prod.out"]}, "output topic 'prod.out'"),
    ({"output_topics": ["audit"]}, "output topic 'audit'"),
    ({"output_topics": ["prod.capture.manifest"]}, "output topic 'prod.capture.manifest'"),
    ({"journal_topic": "prod.capture"}, "journal topic"),
])
def test_replay_writing_to_a_production_topic_is_refused(overrides, role):
    with pytest.raises(ReplayIsolationError, match=f"the replay's {role} is .*a production topic"):
        _config(**overrides).resolved("agent")


def test_production_journal_and_capture_topics_are_protected_even_when_not_listed():
    bare = ReplaySettings("prod.capture", {0: 0}, "prod.journal")  # production_topics empty
    with pytest.raises(ReplayIsolationError, match="journal topic is 'prod.journal'"):
        _config(bare, journal_topic="prod.journal").resolved("agent")
    with pytest.raises(ReplayIsolationError, match="capture topic is 'prod.capture'"):
        _config(bare, capture_topic="prod.capture").resolved("agent")
    _config(bare).resolved("agent")
    # Production ran without a journal: the replay may use any journal topic but the capture.
    no_journal = ReplaySettings("prod.capture", {0: 0}, None)
    _config(no_journal, journal_topic="prod.journal").resolved("agent")


def test_default_journal_topic_of_the_same_uid_is_refused():
    production_journal = default_journal_topic(default_uid("agent"))
    settings = ReplaySettings("prod.capture", {0: 0}, production_journal)
    with pytest.raises(ReplayIsolationError, match="journal topic"):
        _config(settings, journal_topic=None).resolved("agent")


def test_capture_topic_is_not_a_target_when_capture_is_off():
    resolved = _config(capture=False, capture_topic="prod.capture").resolved("agent")
    assert resolved.capture_topic == "prod.capture"
    with pytest.raises(ReplayIsolationError):
        _config(capture=True, capture_topic="prod.capture").resolved("agent")


def test_production_config_is_not_checked_for_isolation():
    resolved = _config(replay=None, journal_topic="prod.journal", capture_topic="prod.capture",
                       output_topics=["prod.out"]).resolved("agent")
    assert resolved.journal_topic == "prod.journal"


def test_fingerprint_policy_defaults_to_re_execute_in_a_replay_and_reuse_otherwise():
    assert _config().resolved("agent").fingerprint_policy is FingerprintPolicy.RE_EXECUTE
    assert _config(replay=None).resolved("agent").fingerprint_policy is FingerprintPolicy.REUSE
    assert _config(fingerprint_policy="fail").resolved("agent").fingerprint_policy is FingerprintPolicy.FAIL
    assert _config(replay=None, fingerprint_policy="re-execute").resolved("agent").fingerprint_policy \
        is FingerprintPolicy.RE_EXECUTE
    with pytest.raises(ConfigError, match="fingerprint_policy must be one of"):
        _config(fingerprint_policy="sometimes").resolved("agent")


def test_capture_topic_config_has_a_retention_default_a_user_value_overrides():
    assert DEFAULT_CAPTURE_RETENTION_MS == 7 * 24 * 3600 * 1000
    resolved = _config().resolved("agent")
    assert resolved.capture_topic_config == {"retention.ms": str(DEFAULT_CAPTURE_RETENTION_MS)}
    custom = _config(capture_topic_config={"retention.ms": "1000", "segment.ms": "60000"}).resolved("agent")
    assert custom.capture_topic_config == {"retention.ms": "1000", "segment.ms": "60000"}


# --- execute_run in replay mode ------------------------------------------------------------------------------------


def make_agent(invoked: list, call_ids: list | None = None):
    """One action that sets memory, then calls each resource ``event.input["calls"]`` names with ``arg`` (and
    ``kwargs``), catching CallBlocked unless ``catch`` is false; outputs the results and its event time."""

    def tool(name):
        def invoke(*args, **kwargs):
            invoked.append(name)
            if call_ids is not None:
                call_ids.append(current_call_id())
            if name == "lookup":
                raise KeyError(f"no order {args[0]}")
            return f"{name}({', '.join(map(str, args))})"
        return invoke

    class Probe(Agent):
        @action(InputEvent)
        def act(event, ctx):
            spec = event.input
            ctx.memory.set("runs", ctx.memory.get("runs", 0) + 1)
            ctx.memory.set("log.last", spec["arg"])
            results = []
            for name in spec["calls"]:
                try:
                    results.append(ctx.call(name, spec["arg"], **spec.get("kwargs", {})))
                except CallBlocked as blocked:
                    if not spec.get("catch", True):
                        raise
                    results.append(f"blocked {blocked.resource}: {blocked.arguments}")
                except KeyError as error:
                    results.append(f"raised KeyError {error.args[0]}")
            ctx.send_event(OutputEvent(output={"results": results, "event_time": ctx.event_time}))

    resources = {
        "pure": Tool(tool("pure"), side_effects="none"),
        "upsert": Tool(tool("upsert"), side_effects="idempotent"),
        "mail": Tool(tool("mail"), side_effects="external"),
        "lookup": Tool(tool("lookup"), side_effects="external"),
    }
    return Probe(resources=resources)


def _input(calls, arg="bob", seq=1, event_time=None, **extra):
    return RunInput("k", KEY_GROUP, seq, {"calls": list(calls), "arg": arg, **extra}, event_time)


def _writer(store):
    return JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), Durability.PER_ACTION)


def _results(result):
    return [output.output["results"] for output in result.outputs]


def _production_records(calls, arg="bob"):
    """Run ``calls`` in production (no replay) and return the recorded calls by (event id, action, position)."""
    invoked = []
    production = execute_run(make_agent(invoked), _input(calls, arg), {})
    assert invoked == list(calls)
    return {(r.event_id, r.action, r.position): r for r in production.calls}, production


@pytest.mark.parametrize("name", ["pure", "upsert", "mail"])
def test_live_policy_makes_the_call_and_records_it(name):
    invoked = []
    replay = ReplayCalls({name: CallPolicy.LIVE})
    result = replay_run(make_agent(invoked), _input([name]), {}, replay)
    assert invoked == [name]
    assert _results(result) == [[f"{name}(bob)"]]
    assert result.error is None and result.blocked == []
    assert result.stats.calls_executed == 1 and result.stats.calls_recorded == 0 and result.stats.calls_blocked == 0
    [record] = result.calls
    assert (record.resource, record.position, record.action) == (name, 0, "act")
    assert record.outcome is CallOutcome.RETURNED and record.result == f"{name}(bob)"


def test_default_policies_in_a_replay_follow_side_effects():
    invoked = []
    result = replay_run(make_agent(invoked), _input(["pure", "upsert", "mail"]), {}, ReplayCalls({}))
    assert invoked == ["pure", "upsert"]
    assert _results(result) == [["pure(bob)", "upsert(bob)", "blocked mail: 'bob'"]]
    assert [b.resource for b in result.blocked] == ["mail"]
    assert result.stats.calls_executed == 2 and result.stats.calls_blocked == 1


def test_wildcard_policy_applies_to_every_other_resource():
    invoked = []
    replay = ReplayCalls(parse_policies("*=blocked,upsert=live"))
    result = replay_run(make_agent(invoked), _input(["pure", "upsert", "mail"]), {}, replay)
    assert invoked == ["upsert"]
    assert [b.resource for b in result.blocked] == ["pure", "mail"]
    assert [b.position for b in result.blocked] == [0, 2]
    replay = ReplayCalls(parse_policies("*=live"))
    replay_run(make_agent(invoked), _input(["mail"]), {}, replay)
    assert invoked == ["upsert", "mail"]


def test_recorded_policy_serves_production_result_without_calling():
    recorded, production = _production_records(["pure", "mail"])
    invoked = []
    replay = ReplayCalls({"*": CallPolicy.RECORDED}, recorded)
    result = replay_run(make_agent(invoked), _input(["pure", "mail"]), {}, replay)
    assert invoked == []
    assert _results(result) == _results(production) == [["pure(bob)", "mail(bob)"]]
    assert result.stats.calls_recorded == 2
    assert result.stats.calls_executed == 0 and result.stats.calls_blocked == 0
    assert [(c.resource, c.position, c.outcome, c.result) for c in result.calls] == \
        [(c.resource, c.position, c.outcome, c.result) for c in production.calls]
    assert result.blocked == []


def test_recorded_policy_for_one_resource_and_live_for_another():
    recorded, _ = _production_records(["mail"])
    invoked = []
    replay = ReplayCalls({"mail": CallPolicy.RECORDED, "pure": CallPolicy.LIVE}, recorded)
    result = replay_run(make_agent(invoked), _input(["mail"]), {}, replay)
    assert invoked == [] and result.stats.calls_recorded == 1
    assert _results(result) == [["mail(bob)"]]


def test_recorded_raised_outcome_is_raised_into_the_action():
    recorded, production = _production_records(["lookup"])
    [record] = recorded.values()
    assert record.outcome is CallOutcome.RAISED and isinstance(decode_exception(record.result), KeyError)
    invoked = []
    replay = ReplayCalls({"lookup": CallPolicy.RECORDED}, recorded)
    result = replay_run(make_agent(invoked), _input(["lookup"]), {}, replay)
    assert invoked == []
    assert _results(result) == _results(production) == [["raised KeyError no order bob"]]
    assert result.stats.calls_recorded == 1 and result.error is None
    assert [c.outcome for c in result.calls] == [CallOutcome.RAISED]


def test_recorded_policy_without_a_record_is_blocked():
    invoked = []
    replay = ReplayCalls({"pure": CallPolicy.RECORDED})
    result = replay_run(make_agent(invoked), _input(["pure"]), {}, replay)
    assert invoked == []
    assert result.stats.calls_blocked == 1 and result.stats.calls_recorded == 0
    assert [(b.resource, b.position) for b in result.blocked] == [("pure", 0)]
    assert _results(result) == [["blocked pure: 'bob'"]]


def test_recorded_policy_with_other_arguments_is_blocked():
    recorded, _ = _production_records(["pure"], arg="alice")
    invoked = []
    replay = ReplayCalls({"pure": CallPolicy.RECORDED}, recorded)
    result = replay_run(make_agent(invoked), _input(["pure"], arg="bob"), {}, replay)
    assert invoked == []
    assert result.stats.calls_blocked == 1 and result.stats.calls_recorded == 0
    assert _results(result) == [["blocked pure: 'bob'"]]


def test_recorded_policy_with_a_record_of_another_resource_is_blocked():
    recorded, _ = _production_records(["upsert"])
    replay = ReplayCalls({"*": CallPolicy.RECORDED}, recorded)
    invoked = []
    result = replay_run(make_agent(invoked), _input(["pure"]), {}, replay)  # same position, other resource
    assert invoked == [] and result.stats.calls_blocked == 1


def test_recorded_policy_ignores_a_started_only_record():
    recorded, _ = _production_records(["mail"])
    started = {slot: dataclasses.replace(r, outcome=CallOutcome.STARTED, result=None) for slot, r in recorded.items()}
    replay = ReplayCalls({"mail": CallPolicy.RECORDED}, started)
    invoked = []
    result = replay_run(make_agent(invoked), _input(["mail"]), {}, replay)
    assert invoked == [] and result.stats.calls_blocked == 1 and result.stats.calls_recorded == 0


def test_blocked_call_raises_call_blocked_the_action_may_handle():
    invoked = []
    replay = ReplayCalls({"mail": CallPolicy.BLOCKED})
    result = replay_run(make_agent(invoked), _input(["mail", "pure"], kwargs={"subject": "hi"}), {}, replay)
    assert invoked == ["pure"]
    assert result.error is None
    assert _results(result) == [["blocked mail: 'bob', subject='hi'", "pure(bob)"]]
    assert result.memory == {"runs": 1, "log": {"last": "bob"}}
    assert result.stats.calls_blocked == 1 and result.stats.calls_executed == 1
    [blocked] = result.blocked
    assert isinstance(blocked, BlockedCall)
    assert (blocked.action, blocked.position, blocked.resource, blocked.arguments) == \
        ("act", 0, "mail", "'bob', subject='hi'")
    assert blocked.event_id == result.calls[0].event_id  # the same input event as the live call
    assert [c.resource for c in result.calls] == ["pure"]  # a blocked call has no call record


def test_call_blocked_message_says_why():
    messages = []

    class Catcher(Agent):
        @action(InputEvent)
        def act(event, ctx):
            for name in ("mail", "pure"):
                try:
                    ctx.call(name, 1)
                except CallBlocked as blocked:
                    messages.append(str(blocked))
            ctx.send_event(OutputEvent(output=None))

    agent = Catcher(resources={"mail": Tool(lambda x: x), "pure": Tool(lambda x: x, side_effects="none")})
    execute_run(agent, RunInput("k", KEY_GROUP, 1, None), {},
                gate=ReplayCalls({"mail": CallPolicy.BLOCKED, "pure": CallPolicy.RECORDED}), report_failures=True)
    assert "call 0 to 'mail' in action act" in messages[0] and "its policy is 'blocked'" in messages[0]
    assert "call 1 to 'pure'" in messages[1] and "production made no such call" in messages[1]


def test_uncaught_call_blocked_fails_the_run_and_leaves_memory_as_it_was():
    invoked = []
    memory = {"runs": 5, "log": {"last": "old"}}
    expected_memory = copy.deepcopy(memory)
    replay = ReplayCalls({"mail": CallPolicy.BLOCKED})
    result = replay_run(make_agent(invoked), _input(["pure", "mail"], catch=False, seq=6), memory, replay)
    assert result.error is not None and result.error.startswith("CallBlocked")
    assert "'mail'" in result.error
    assert result.outputs == []
    assert result.memory == expected_memory
    assert result.seq == 6
    assert invoked == ["pure"]
    assert [(b.resource, b.arguments) for b in result.blocked] == [("mail", "'bob'")]
    assert result.stats.calls_blocked == 1
    assert [c.resource for c in result.calls] == ["pure"]


def test_other_exception_fails_a_replay_run_but_propagates_in_production():
    class Broken(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.memory.set("touched", True)
            raise ZeroDivisionError("new code bug")

    run = RunInput("k", KEY_GROUP, 1, "x")
    result = replay_run(Broken(), run, {"touched": False}, ReplayCalls({}))
    assert result.error == "ZeroDivisionError: new code bug"
    assert result.memory == {"touched": False} and result.outputs == []
    with pytest.raises(ZeroDivisionError, match="new code bug"):
        execute_run(Broken(), run, {})


def test_without_replay_an_uncaught_exception_from_a_call_propagates():
    invoked = []

    class Strict(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.call("lookup", event.input)

    agent = Strict(resources=make_agent(invoked).resources)
    with pytest.raises(KeyError, match="no order o-1"):
        execute_run(agent, RunInput("k", KEY_GROUP, 1, "o-1"), {})
    assert invoked == ["lookup"]
    result = replay_run(agent, RunInput("k", KEY_GROUP, 1, "o-1"), {}, ReplayCalls({"*": CallPolicy.LIVE}))
    assert result.error.startswith("KeyError") and invoked == ["lookup", "lookup"]


def test_live_call_ids_carry_the_replay_prefix():
    invoked, ids = [], []
    agent = make_agent(invoked, ids)
    replay_run(agent, _input(["pure"]), {}, ReplayCalls({"*": CallPolicy.LIVE}))
    replay_run(agent, _input(["pure"]), {}, ReplayCalls({"*": CallPolicy.LIVE}, call_id_prefix="replay:j1:"))
    execute_run(agent, _input(["pure"]), {})
    replay_default, replay_custom, production = ids
    assert replay_default.startswith("replay:Probe:")
    assert replay_custom.startswith("replay:j1:Probe:")
    assert production.startswith("Probe:") and not production.startswith("replay:")
    # The same logical call: only the prefix differs.
    assert replay_default == "replay:" + production
    assert replay_custom == "replay:j1:" + production
    assert current_call_id() is None


@pytest.mark.parametrize("event_time", [1_700_000_000_123, None])
def test_event_time_reaches_the_action(event_time):
    result = replay_run(make_agent([]), _input([], event_time=event_time), {}, ReplayCalls({}))
    assert [o.output["event_time"] for o in result.outputs] == [event_time]
    production = execute_run(make_agent([]), _input([], event_time=event_time), {})
    assert [o.output["event_time"] for o in production.outputs] == [event_time]


def test_recorded_calls_are_journaled_in_the_replays_journal_and_reused_after_a_failover():
    recorded, _ = _production_records(["mail"])
    store = MemoryJournalStore(4)
    invoked = []
    agent = make_agent(invoked)
    replay = ReplayCalls({"mail": CallPolicy.RECORDED}, recorded)
    first = replay_run(agent, _input(["mail"]), {}, replay, journal=_writer(store).run_journal(KEY_GROUP))
    assert invoked == [] and first.stats.calls_recorded == 1
    # accepted, the served call, the completion (no 'started' record: nothing was called)
    assert len(store.records(KEY_GROUP)) == 3
    end = store.end_offsets([KEY_GROUP])
    history = read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, end).history(key_digest("k"))
    again = replay_run(agent, _input(["mail"]), {}, ReplayCalls({"mail": CallPolicy.BLOCKED}), history=history)
    assert invoked == [] and again.stats.actions_reused == 1 and again.stats.calls_blocked == 0
    assert [o.output for o in again.outputs] == [o.output for o in first.outputs]


def test_blocked_call_writes_no_started_record_to_the_journal():
    store = MemoryJournalStore(4)
    replay = ReplayCalls({"mail": CallPolicy.BLOCKED})
    result = execute_run(make_agent([]), _input(["mail"], catch=False), {},
                         journal=_writer(store).run_journal(KEY_GROUP), gate=replay, report_failures=True)
    assert result.error.startswith("CallBlocked")
    kinds = [RecordCodec.peek_header(value)["kind"] for _, value in store.records(KEY_GROUP)]
    assert kinds == ["accepted", "failed"]  # no call record: the CallBlocked left the action


def test_a_run_that_reuses_an_action_reports_that_actions_calls_for_the_capture():
    """A restored production run that reuses a journaled action still hands back the action's calls: a capture
    of the run must hold every call a later replay may be asked to serve as recorded."""
    store = MemoryJournalStore(4)
    invoked: list = []
    agent = make_agent(invoked)
    first = execute_run(agent, _input(["pure", "upsert"]), {}, journal=_writer(store).run_journal(KEY_GROUP))
    end = store.end_offsets([KEY_GROUP])
    history = read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, end).history(key_digest("k"))
    again = execute_run(agent, _input(["pure", "upsert"]), {}, history=history)
    assert invoked == ["pure", "upsert"] and again.stats.actions_reused == 1  # nothing ran twice
    assert [(c.resource, c.result) for c in again.calls] == [(c.resource, c.result) for c in first.calls]
    assert len(again.calls) == 2


def test_recorded_policy_serves_production_calls_made_in_another_order():
    # A set iterated under another PYTHONHASHSEED than production's: the same calls, in another order.
    recorded, production = _production_records(["pure", "mail"])
    invoked = []
    replay = ReplayCalls({"*": CallPolicy.RECORDED}, recorded)
    result = replay_run(make_agent(invoked), _input(["mail", "pure"]), {}, replay)
    assert invoked == [] and result.blocked == []
    assert result.stats.calls_recorded == 2
    assert _results(result) == [["mail(bob)", "pure(bob)"]]


def test_recorded_policy_serves_each_production_call_once():
    recorded, _ = _production_records(["pure"])
    invoked = []
    replay = ReplayCalls({"*": CallPolicy.RECORDED}, recorded)
    result = replay_run(make_agent(invoked), _input(["pure", "pure"]), {}, replay)
    assert invoked == []
    assert (result.stats.calls_recorded, result.stats.calls_blocked) == (1, 1)  # production made it once
