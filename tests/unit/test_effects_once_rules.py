"""The rules behind the every-effect-once guarantee, on the in-memory journal: failed actions, exceptions,
in-place memory changes, shared events, call ids, attempt records and record sizes."""

from __future__ import annotations

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.memory import Memory, MemoryUpdate
from flink_agents_replay.api.resources import Tool, current_call_id
from flink_agents_replay.core.errors import CallInDoubtError, CallTimeoutError, JournalRecordTooLargeError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.attempts import read_job_history, write_attempt_records
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import JournalClosedError, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest
from flink_agents_replay.storage.records.raised import decode_exception, encode_exception

KEY_GROUP = 2
SIGNING_KEY = b"effects-once-rules-key"


def _writer(store: MemoryJournalStore, **kwargs) -> JournalWriter:
    return JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), "per_action", **kwargs)


def _history(store: MemoryJournalStore, key: str = "k"):
    end = store.end_offsets([KEY_GROUP])
    return read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, end).history(key_digest(key))


def _run(agent, store, value="in", seq=1, memory=None, history=None, writer=None):
    return execute_run(agent, RunInput("k", KEY_GROUP, seq, value), memory if memory is not None else {},
                       history=history, journal=(writer or _writer(store)).run_journal(KEY_GROUP))


# -- failed calls ------------------------------------------------------------------------------------------------
class FlakyService:
    """Down (ConnectionError) while ``down`` is true; counts invocations."""

    def __init__(self):
        self.down = True
        self.invocations = 0

    def __call__(self, text):
        self.invocations += 1
        if self.down:
            raise ConnectionError(f"service down for {text}")
        return f"ok({text})"


def flaky_agent(service: FlakyService, handle: bool) -> Agent:
    class Flaky(Agent):
        @action(InputEvent)
        def act(event, ctx):
            first = ctx.call("steady", event.input)
            try:
                answer = ctx.call("flaky", first)
            except ConnectionError:
                if not handle:
                    raise
                answer = "fallback"
            ctx.send_event(OutputEvent(output=answer))

    steady = []
    return Flaky(resources={"steady": Tool(lambda text: steady.append(text) or f"s({text})", side_effects="none"),
                            "flaky": Tool(service, side_effects="none")})


def test_a_call_whose_exception_failed_its_action_is_made_again_and_counted():
    service, store = FlakyService(), MemoryJournalStore(4)
    with pytest.raises(ConnectionError):
        _run(flaky_agent(service, handle=False), store)
    service.down = False
    again = _run(flaky_agent(service, handle=False), store, history=_history(store))
    assert [o.output for o in again.outputs] == ["ok(s(in))"]
    assert service.invocations == 2 and again.stats.calls_reused == 1  # the steady call was reused
    assert again.stats.calls_retried_after_failure == 1
    # A third attempt after that one finished reuses everything, the retried call's result included.
    third = _run(flaky_agent(service, handle=False), store, history=_history(store))
    assert service.invocations == 2 and third.stats.actions_reused == 1


def test_a_handled_exception_is_reused_as_raised():
    service, store = FlakyService(), MemoryJournalStore(4)
    first = _run(flaky_agent(service, handle=True), store)
    service.down = False  # reuse must not ask again: the action decided on the failure
    again = _run(flaky_agent(service, handle=True), store, history=_history(store))
    assert [o.output for o in first.outputs] == [o.output for o in again.outputs] == ["fallback"]
    assert service.invocations == 1


def test_a_crash_after_a_handled_exception_reuses_it():
    """Killed mid-way after handling: no failure record, so the RAISED result is reused (the action saw it)."""
    service, store = FlakyService(), MemoryJournalStore(4)
    _run(flaky_agent(service, handle=True), store)
    crashed = MemoryJournalStore(4)
    for key, value in store.records(KEY_GROUP)[:3]:  # accepted, steady call, flaky call (RAISED)
        crashed.append(KEY_GROUP, key, value)
    service.down = False
    again = _run(flaky_agent(service, handle=True), crashed, history=_history(crashed))
    assert [o.output for o in again.outputs] == ["fallback"] and service.invocations == 1


def test_an_action_that_handled_a_failure_and_crashed_later_takes_the_same_path_again():
    """Only calls whose exception left the action are made again: a handled one keeps the action on its path,
    so a later external call keeps its place and is reused (found by an adversarial review: get-or-create)."""
    store, lookups, charges, crashes = MemoryJournalStore(4), [], [], []

    def lookup(text):
        lookups.append(text)
        if len(lookups) == 1:  # missing at first; found once anything looks again
            raise LookupError(f"no account for {text}")
        return f"found({text})"

    class Charging(Agent):
        @action(InputEvent)
        def act(event, ctx):
            try:
                account = ctx.call("lookup", event.input)
            except LookupError:
                account = ctx.call("create", event.input)
            receipt = ctx.call("charge", account)
            if not crashes:
                crashes.append("crash")
                raise RuntimeError("crash after the charge")  # not raised from or while handling a call's error
            ctx.send_event(OutputEvent(output=receipt))

    agent = Charging(resources={"lookup": Tool(lookup, side_effects="none"),
                                "create": Tool(lambda text: f"new({text})", side_effects="external"),
                                "charge": Tool(lambda account: charges.append(account) or f"paid({account})")})
    with pytest.raises(RuntimeError):
        _run(agent, store)
    again = _run(agent, store, history=_history(store))
    assert [o.output for o in again.outputs] == ["paid(new(in))"]
    assert (lookups, charges) == (["in"], ["new(in)"]) and again.stats.calls_retried_after_failure == 0


def test_a_resource_gets_a_copy_of_its_arguments():
    """A tool that appends to the list it is given must not change the action's memory: a reused call could not
    do it again (found by an adversarial review: a chat wrapper appending its reply to the history)."""
    class Chat(Agent):
        @action(InputEvent)
        def act(event, ctx):
            history = ctx.memory.get("chat") or []
            history.append(event.input)
            ctx.memory.set("chat", history)
            ctx.send_event(OutputEvent(output=ctx.call("llm", history)))

    def llm(history):
        history.append("assistant reply")
        return len(history)

    result = execute_run(Chat(resources={"llm": Tool(llm, side_effects="none")}), RunInput("k", KEY_GROUP, 1, "hi"),
                         {})
    assert result.memory == {"chat": ["hi"]} and [o.output for o in result.outputs] == [2]


class NeedsResponse(Exception):
    """Like HTTP client errors: the constructor takes keyword-only arguments it does not pass to ``args``."""

    def __init__(self, message, *, response, body=None):
        super().__init__(message)
        self.response = response
        self.body = body


def test_exceptions_keep_their_type_and_attributes_through_the_journal():
    from flink_agents_replay.storage.formats.plain import dump_user, load_user

    for raised in (NeedsResponse("bad gateway", response={"status": 502}, body=b"x"), ConnectionError("down"),
                   OSError(111, "refused"), KeyError("k"), FileNotFoundError(2, "No such file", "/no/doc.txt"),
                   UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), StopIteration(5)):
        restored = decode_exception(load_user(dump_user(encode_exception(raised))))  # as the journal keeps it
        assert type(restored) is type(raised) and restored.args == raised.args and str(restored) == str(raised)
        assert vars(restored) == vars(raised)
        for name in ("filename", "encoding", "value"):  # kept outside __dict__ by built-in exceptions
            assert getattr(restored, name, None) == getattr(raised, name, None)


# -- memory changed in place -----------------------------------------------------------------------------------
def test_in_place_changes_are_journaled_and_reproduced_by_reuse():
    memory = Memory({"log": ["a"], "profile": {"tags": {"x"}}, "n": 1})
    memory.get("log").append("b")
    memory.get("profile.tags").add("y")
    memory.get("n")
    updates = memory.take_updates()
    assert updates == [MemoryUpdate("log", ["a", "b"]), MemoryUpdate("profile", {"tags": {"x", "y"}})]
    replayed = Memory({"log": ["a"], "profile": {"tags": {"x"}}, "n": 1})
    replayed.apply(updates)
    assert replayed.data == memory.data


def test_a_read_only_action_journals_nothing_and_set_calls_are_not_doubled():
    memory = Memory({"log": ["a"], "profile": {"name": "n"}})
    memory.get("log")
    memory.set("profile.city", "Paris")
    assert memory.take_updates() == [MemoryUpdate("profile.city", "Paris")]


def test_entries_share_no_object_after_an_action():
    memory = Memory()
    shared = []
    memory.set("a", shared)
    memory.set("b", shared)
    memory.take_updates()
    memory.get("a").append(1)  # a failure-free run must see what reuse sees: b unchanged
    assert memory.take_updates() == [MemoryUpdate("a", [1])]
    assert memory.data == {"a": [1], "b": []}


class Noted(Event):
    pass


def sharing_agent(calls: list) -> Agent:
    class Sharing(Agent):
        @action(InputEvent)
        def note(event, ctx):
            items = [ctx.call("tool", event.input)]
            ctx.memory.set("items", items)
            ctx.send_event(Noted(items=items))

        @action(Noted)
        def grow(event, ctx):
            event.items.append("changed by grow")  # its own copy of the event
            ctx.memory.get("items").append(ctx.call("tool", "more"))

        @action(Noted)
        def report(event, ctx):
            ctx.send_event(OutputEvent(output={"event": list(event.items), "memory": list(ctx.memory.get("items"))}))

    return Sharing(resources={"tool": Tool(lambda text: calls.append(text) or text.upper(), side_effects="none")})


def test_events_and_memory_changed_by_one_action_look_the_same_after_reuse():
    calls, store = [], MemoryJournalStore(4)
    first = _run(sharing_agent(calls), store)
    again = _run(sharing_agent(calls), store, history=_history(store))
    expected = {"event": ["IN"], "memory": ["IN", "MORE"]}
    assert [o.output for o in first.outputs] == [o.output for o in again.outputs] == [expected]
    assert first.memory == again.memory == {"items": ["IN", "MORE"]} and calls == ["in", "more"]


# -- call ids --------------------------------------------------------------------------------------------------
def id_agent(ids: list) -> Agent:
    class Ids(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.call("svc", event.input)
            ctx.send_event(OutputEvent(output=None))

    return Ids(resources={"svc": Tool(lambda text: ids.append(current_call_id()), side_effects="external")})


def test_call_ids_are_stable_per_request_and_differ_between_requests():
    ids: list = []
    for value in ("order-1", "order-1", "order-2"):
        execute_run(id_agent(ids), RunInput("k", KEY_GROUP, 1, value), {})
    execute_run(id_agent(ids), RunInput("k", KEY_GROUP, 2, "order-1"), {})
    first, same, other_input, other_seq = ids
    assert first == same and len({first, other_input, other_seq}) == 3
    assert first.startswith("Ids:act:1:0:") and first.isascii() and len(first) < 80


# -- records tied to the job -----------------------------------------------------------------------------------
def test_attempt_records_tie_history_to_its_job():
    store = MemoryJournalStore(4)
    writer = _writer(store)
    _run(sharing_agent([]), store)  # an earlier job's records
    write_attempt_records(writer, [KEY_GROUP], "job-b", 0, 0)
    _run(sharing_agent([]), store, value="b", writer=writer)  # the attempt that wrote the record writes on
    codec = RecordCodec(SIGNING_KEY, "op")
    other = read_job_history(store, codec, [KEY_GROUP], {"job-c"})
    assert not other.found and other.other_records == len(store.records(KEY_GROUP)) - 1
    mine = read_job_history(store, codec, [KEY_GROUP], {"job-b"})
    assert mine.found and mine.last_attempt == 0
    history = mine.index.history(key_digest("k"))
    assert history.recorded_input(1) is not None and history.input_matches(1, _digest("b"))
    continued = read_job_history(store, codec, [KEY_GROUP], {"job-d", "job-b"})  # job d continues job b
    assert continued.found and continued.index.records_read == mine.index.records_read


def test_a_checkpoint_restore_passes_over_attempt_records_in_its_range():
    """Another job's start inside the range a savepoint restore reads is no key's history (it would hold the
    prune floor and the 'restored' state forever)."""
    store = MemoryJournalStore(4)
    write_attempt_records(_writer(store), [KEY_GROUP], "job-c", 0, 0)
    _run(sharing_agent([]), store)
    index = read_recovery_index(store, RecordCodec(SIGNING_KEY, "op"), {KEY_GROUP: 0}, store.end_offsets([KEY_GROUP]))
    assert len(index) == 1 and index.history(key_digest("k")) is not None
    assert index.floor_offsets() == {KEY_GROUP: 1}


def _digest(value):
    from flink_agents_replay.engine.digest import digest_value

    return digest_value(value)


# -- limits ----------------------------------------------------------------------------------------------------
def test_a_record_larger_than_kafka_takes_names_the_action_and_the_memory_path():
    class Grows(Agent):
        @action(InputEvent)
        def grow(event, ctx):
            ctx.memory.set("small", 1)
            ctx.memory.set("document", "x" * 5000)
            ctx.send_event(OutputEvent(output=None))

    store = MemoryJournalStore(4)
    with pytest.raises(JournalRecordTooLargeError, match=r"action grow .*Largest parts: memory path 'document' 5,0"):
        execute_run(Grows(), RunInput("k", KEY_GROUP, 1, "in"), {},
                    journal=_writer(store, max_record_bytes=4096).run_journal(KEY_GROUP))


def test_a_closed_journal_refuses_writes_of_abandoned_runs():
    store = MemoryJournalStore(4)
    writer = _writer(store)
    writer.close()
    with pytest.raises(JournalClosedError):
        execute_run(sharing_agent([]), RunInput("k", KEY_GROUP, 1, "in"), {}, journal=writer.run_journal(KEY_GROUP))
    assert store.records(KEY_GROUP) == []


def test_a_tool_with_a_timeout_gives_up_waiting_and_keeps_the_call_id():
    import threading

    from flink_agents_replay.core.errors import CallTimeoutError

    release, seen = threading.Event(), []

    def slow(text):
        seen.append(current_call_id())
        release.wait(10)  # released below: the hung service
        return text

    class Slow(Agent):
        @action(InputEvent)
        def act(event, ctx):
            try:
                ctx.call("slow", event.input)
            except CallTimeoutError:
                ctx.send_event(OutputEvent(output="timed out"))

    agent = Slow(resources={"slow": Tool(slow, side_effects="external", timeout_s=0.2)})
    result = execute_run(agent, RunInput("k", KEY_GROUP, 1, "in"), {})
    release.set()
    assert [o.output for o in result.outputs] == ["timed out"]
    assert seen and seen[0].startswith("Slow:act:1:0:")


# -- found by a fresh-eyes review --------------------------------------------------------------------------------
def _attempts(agent, store, attempts: int = 4, on_failure=None):
    """Run one input until it finishes, as restarts would (each attempt with the journal so far)."""
    for attempt in range(attempts):
        try:
            return _run(agent, store, history=_history(store) if attempt else None)
        except Exception:  # noqa: BLE001 - an attempt that failed: the next one recovers
            if on_failure is not None:
                on_failure(attempt)
    raise AssertionError(f"no attempt of {attempts} finished")


def test_a_retry_loop_that_gave_up_is_made_again_by_the_next_attempt():
    service = FlakyService()

    class GivesUp(Agent):
        @action(InputEvent)
        def act(event, ctx):
            for _ in range(3):
                try:
                    ctx.send_event(OutputEvent(output=ctx.call("flaky", event.input)))
                    return
                except ConnectionError:
                    pass
            raise RuntimeError("still down after 3 tries")  # raised outside the except: no __context__

    result = _attempts(GivesUp(resources={"flaky": Tool(service, side_effects="none")}), MemoryJournalStore(4),
                       on_failure=lambda attempt: setattr(service, "down", False))
    assert [o.output for o in result.outputs] == ["ok(in)"] and service.invocations == 4
    assert result.stats.calls_retried_after_failure == 1  # the first one made again returns: the loop ends


def test_every_failed_child_of_a_fan_out_runs_again_in_one_attempt():
    down, runs = {"on": True}, []

    class Child(Agent):
        @action(InputEvent)
        def work(event, ctx):
            runs.append(event.input)
            if down["on"]:
                raise ConnectionError(f"child {event.input} down")
            ctx.send_event(OutputEvent(output=f"done {event.input}"))

    class Parent(Agent):
        @action(InputEvent)
        def fan(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call_agents([("Child", i) for i in range(3)])))

    result = _attempts(Parent(sub_agents=[Child()]), MemoryJournalStore(4),
                       on_failure=lambda attempt: down.update(on=False))
    assert runs == [0, 1, 2, 0, 1, 2]  # one failed attempt, then all three at once
    assert [o.output for o in result.outputs] == [[["done 0"], ["done 1"], ["done 2"]]]


def test_a_retried_call_gets_a_call_id_of_its_own():
    service, ids = FlakyService(), []

    def flaky(text):
        ids.append(current_call_id())
        return service(text)

    class Once(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("flaky", event.input)))

    _attempts(Once(resources={"flaky": Tool(flaky, side_effects="none")}), MemoryJournalStore(4),
              on_failure=lambda attempt: setattr(service, "down", False))
    assert len(ids) == 2 and ids[0] != ids[1]  # a service may have stored the failure under the first id


def test_a_timed_out_call_is_in_doubt_and_its_policy_decides():
    import time as clock

    charges = []

    def charge(text):
        clock.sleep(0.3)  # the slow service: it still takes effect after the caller stopped waiting
        charges.append(text)
        return "receipt"

    class Pays(Agent):
        @action(InputEvent)
        def pay(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("charge", event.input)))

    store = MemoryJournalStore(4)
    agent = Pays(resources={"charge": Tool(charge, side_effects="external", in_doubt="fail", timeout_s=0.05)})
    with pytest.raises(CallTimeoutError):
        _run(agent, store)
    clock.sleep(0.4)
    with pytest.raises(CallInDoubtError):
        _run(agent, store, history=_history(store))
    assert charges == ["in"]


def test_events_sent_together_share_no_object():
    class Split(Event):
        pass

    class Report(Event):
        pass

    class Sharing(Agent):
        @action(InputEvent)
        def split(event, ctx):
            items = ["x"]
            ctx.send_event(Split(items=items))
            ctx.send_event(Report(items=items))

        @action(Split)
        def enrich(event, ctx):
            event.items.append("enriched")
            ctx.send_event(OutputEvent(output=None))

        @action(Report)
        def report(event, ctx):
            ctx.send_event(OutputEvent(output=list(event.items)))

    store = MemoryJournalStore(4)
    first = _run(Sharing(), store)
    again = _run(Sharing(), store, history=_history(store))
    assert [o.output for o in first.outputs] == [o.output for o in again.outputs] == [None, ["x"]]


def test_a_call_result_changed_by_the_action_stays_as_journaled():
    class Changes(Agent):
        @action(InputEvent)
        def act(event, ctx):
            reply = ctx.call("llm", event.input)
            reply.append("changed by the action")
            ctx.send_event(OutputEvent(output=reply))

    result = execute_run(Changes(resources={"llm": Tool(lambda text: [text], side_effects="none")}),
                         RunInput("k", KEY_GROUP, 1, "hi"), {})
    assert [call.result for call in result.calls] == [["hi"]]  # what the capture records
