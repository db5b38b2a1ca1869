"""The run engine on an in-memory journal: execution, reuse, partial actions, divergence, policies."""

import threading
from collections import Counter

import pytest

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool, current_call_id
from flink_agents_replay.core.errors import (
    AgentDefinitionError,
    CallInDoubtError,
    FingerprintMismatchError,
    NotPicklableError,
    SignatureError,
)
from flink_agents_replay.engine import FingerprintPolicy, RunInput, execute_run
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

KEY_GROUP = 3
SIGNING_KEY = b"0123456789abcdef0123"


class Classified(Event):
    pass


class Drafted(Event):
    pass


class Crash(Exception):
    pass


def make_agent(calls: Counter, crash_at: set | None = None):
    """3 chained actions, 2 journaled calls each; ``crash_at`` holds (action, call index) to crash after."""
    crash_at = crash_at if crash_at is not None else set()

    def tool(name):
        def invoke(text):
            calls[name] += 1
            return f"{name}({text})"
        return invoke

    class Triage(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            first = ctx.call("t1", event.input)
            if ("classify", 1) in crash_at:
                crash_at.discard(("classify", 1))
                raise Crash("after first call")
            second = ctx.call("t2", first)
            ctx.memory.set("history.last", second)
            ctx.memory.set("count", ctx.memory.get("count", 0) + 1)
            ctx.send_event(Classified(label=second))

        @action(Classified)
        def draft(event, ctx):
            a = ctx.call("t3", event.label)
            b = ctx.call("t4", a)
            ctx.send_event(Drafted(text=b))

        @action(Drafted)
        def reply(event, ctx):
            a = ctx.call("t5", event.text)
            b = ctx.call("t6", a)
            ctx.send_event(OutputEvent(output={"reply": b, "count": ctx.memory.get("count")}))

    resources = {f"t{i}": Tool(tool(f"t{i}"), side_effects="none") for i in range(1, 7)}
    return Triage(resources=resources)


def writer(store, durability=Durability.PER_ACTION, producer="op"):
    return JournalWriter(store, RecordCodec(SIGNING_KEY, producer), durability)


def run_inputs(agent, inputs, journal_writer, index=None, memories=None):
    memories = memories if memories is not None else {}
    outputs = []
    for key, seq, value in inputs:
        history = index.history(key_digest(key)) if index else None
        result = execute_run(agent, RunInput(key, KEY_GROUP, seq, value), memories.get(key, {}),
                             history=history, journal=journal_writer.run_journal(KEY_GROUP))
        memories[key] = result.memory
        outputs += [(key, seq, o.id, repr(o.output)) for o in result.outputs]
    return outputs, memories


def recover(store, producer="op"):
    end = store.end_offsets([KEY_GROUP])
    return read_recovery_index(store, RecordCodec(SIGNING_KEY, producer), {KEY_GROUP: 0}, end)


INPUTS = [("k1", 1, "a"), ("k2", 1, "b"), ("k1", 2, "c")]


def test_fresh_run_executes_every_action_and_journals_it():
    calls, store = Counter(), MemoryJournalStore(8)
    outputs, memories = run_inputs(make_agent(calls), INPUTS, writer(store))
    assert sum(calls.values()) == 3 * 6
    assert len(outputs) == 3 and memories["k1"]["count"] == 2
    # 1 accepted record, 6 call records and 3 completions per input.
    assert len(store.records(KEY_GROUP)) == 3 * 10


def test_replay_reuses_everything_with_same_ids_outputs_and_memory():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = make_agent(calls)
    first_outputs, first_memories = run_inputs(agent, INPUTS, writer(store))
    calls.clear()
    replayed_outputs, replayed_memories = run_inputs(agent, INPUTS, writer(store), index=recover(store))
    assert sum(calls.values()) == 0
    assert replayed_outputs == first_outputs
    assert replayed_memories == first_memories


def test_crash_between_two_calls_reuses_the_first():
    calls, store = Counter(), MemoryJournalStore(8)
    crash_at = {("classify", 1)}
    agent = make_agent(calls, crash_at)
    with pytest.raises(Crash):
        run_inputs(agent, INPUTS[:1], writer(store))
    assert calls == Counter({"t1": 1})
    outputs, _ = run_inputs(agent, INPUTS[:1], writer(store), index=recover(store))
    assert calls["t1"] == 1 and calls["t2"] == 1 and sum(calls.values()) == 6
    assert len(outputs) == 1


def test_different_input_at_journaled_seq_diverges_only_that_key():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = make_agent(calls)
    run_inputs(agent, INPUTS, writer(store))
    calls.clear()
    index = recover(store)
    changed = [("k1", 1, "DIFFERENT"), ("k2", 1, "b"), ("k1", 2, "c")]
    memories = {}
    stats = Counter()
    for key, seq, value in changed:
        result = execute_run(agent, RunInput(key, KEY_GROUP, seq, value), memories.get(key, {}),
                             history=index.history(key_digest(key)), journal=writer(store).run_journal(KEY_GROUP))
        memories[key] = result.memory
        stats.update(result.stats.as_dict())
    # k1 re-executes both inputs (seq 2's records belong to the old history); k2 reuses.
    assert sum(calls.values()) == 2 * 6
    assert stats["divergences"] == 1
    assert stats["actions_reused"] == 3


def test_multi_action_runs_are_not_divergence():
    calls, store = Counter(), MemoryJournalStore(8)
    agent = make_agent(calls)
    run_inputs(agent, INPUTS, writer(store))
    index = recover(store)
    result = execute_run(agent, RunInput("k1", KEY_GROUP, 1, "a"), {}, history=index.history(key_digest("k1")),
                         journal=writer(store).run_journal(KEY_GROUP))
    assert result.stats.divergences == 0 and result.stats.actions_reused == 3


def test_typed_exception_is_journaled_and_reraised_as_same_type():
    store = MemoryJournalStore(4)
    attempts = Counter()

    def lookup(order_id):
        attempts["lookup"] += 1
        raise KeyError(f"no order {order_id}")

    class Lookup(Agent):
        @action(InputEvent)
        def find(event, ctx):
            try:
                ctx.call("lookup", event.input)
            except KeyError as exc:
                ctx.send_event(OutputEvent(output=f"missing: {exc}"))

    agent = Lookup(resources={"lookup": lookup})
    first = execute_run(agent, RunInput("k", KEY_GROUP, 1, "o-1"), {}, journal=writer(store).run_journal(KEY_GROUP))
    # Replay a cut-short action: drop the completion so the call records alone are served.
    accepted, started, raised, _completion = store.records(KEY_GROUP)  # a Tool is "external": started, raised
    partial = MemoryJournalStore(4)
    partial.append(KEY_GROUP, *accepted)
    partial.append(KEY_GROUP, *started)
    partial.append(KEY_GROUP, *raised)
    second = execute_run(agent, RunInput("k", KEY_GROUP, 1, "o-1"), {},
                         history=recover(partial).history(key_digest("k")),
                         journal=writer(partial).run_journal(KEY_GROUP))
    assert attempts["lookup"] == 1
    assert second.stats.calls_reused == 1
    assert [o.output for o in second.outputs] == [o.output for o in first.outputs]


def _in_doubt_setup(policy):
    store = MemoryJournalStore(4)
    sent = Counter()

    def send_mail(to):
        sent[to] += 1
        return "sent"

    class Mailer(Agent):
        @action(InputEvent)
        def mail(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("mail", event.input)))

    agent = Mailer(resources={"mail": Tool(send_mail, side_effects="external", in_doubt=policy)})
    execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, journal=writer(store).run_journal(KEY_GROUP))
    started_only = MemoryJournalStore(4)
    for record in store.records(KEY_GROUP)[:2]:  # the accepted record and the acknowledged "started" record
        started_only.append(KEY_GROUP, *record)
    history = recover(started_only).history(key_digest("k"))
    return agent, history, started_only, sent


def test_in_doubt_call_is_rerun_by_default():
    agent, history, store, sent = _in_doubt_setup("rerun")
    result = execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, history=history,
                         journal=writer(store).run_journal(KEY_GROUP))
    assert sent["bob"] == 2 and result.stats.calls_in_doubt == 1


def test_in_doubt_call_can_fail():
    agent, history, store, sent = _in_doubt_setup("fail")
    with pytest.raises(CallInDoubtError, match="never reported back"):
        execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, history=history,
                    journal=writer(store).run_journal(KEY_GROUP))
    assert sent["bob"] == 1


def test_in_doubt_call_can_be_assumed_done():
    agent, history, store, sent = _in_doubt_setup("assume_done")
    result = execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, history=history,
                         journal=writer(store).run_journal(KEY_GROUP))
    assert sent["bob"] == 1 and [o.output for o in result.outputs] == [None]


def test_call_id_names_the_logical_call_and_is_the_same_when_a_call_in_doubt_is_made_again():
    seen: list[str | None] = []

    def send_mail(to):
        seen.append(current_call_id())
        return "sent"

    class Mailer(Agent):
        @action(InputEvent)
        def mail(event, ctx):
            ctx.call("mail", event.input)
            ctx.call("mail", event.input)
            ctx.send_event(OutputEvent(output="done"))

    agent = Mailer(resources={"mail": Tool(send_mail, side_effects="external")})
    store = MemoryJournalStore(4)
    execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, journal=writer(store).run_journal(KEY_GROUP))
    execute_run(agent, RunInput("k", KEY_GROUP, 2, "bob"), {})
    first, second, next_seq, _ = seen
    assert first and second and next_seq and len({first, second, next_seq}) == 3
    assert first.startswith("Mailer:") and current_call_id() is None

    started_only = MemoryJournalStore(4)
    for record in store.records(KEY_GROUP)[:2]:  # accepted; the first call started, never reported
        started_only.append(KEY_GROUP, *record)
    seen.clear()
    execute_run(agent, RunInput("k", KEY_GROUP, 1, "bob"), {}, history=recover(started_only).history(key_digest("k")),
                journal=writer(started_only).run_journal(KEY_GROUP))
    assert seen == [first, second]


def test_non_picklable_memory_value_names_action_and_path():
    class Leaky(Agent):
        @action(InputEvent)
        def keep(event, ctx):
            ctx.memory.set("conn.handle", threading.Lock())  # locks do not pickle
            ctx.send_event(OutputEvent(output=1))

    with pytest.raises(NotPicklableError, match=r"action keep set memory path 'conn.handle'"):
        execute_run(Leaky(), RunInput("k", KEY_GROUP, 1, "x"), {},
                    journal=writer(MemoryJournalStore(4)).run_journal(KEY_GROUP))


def test_unhandled_event_type_is_a_clear_error():
    class Orphan(Event):
        pass

    class Sender(Agent):
        @action(InputEvent)
        def go(event, ctx):
            ctx.send_event(Orphan())

    with pytest.raises(AgentDefinitionError, match="no action handles Orphan"):
        execute_run(Sender(), RunInput("k", KEY_GROUP, 1, "x"), {})


@pytest.mark.parametrize("policy", list(FingerprintPolicy))
def test_fingerprint_mismatch_policies(policy):
    calls, store = Counter(), MemoryJournalStore(4)

    class V1(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("t", "v1")))

    class V2(Agent):
        @action(InputEvent)
        def act(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("t", "v2")))

    def tool(x):
        calls[x] += 1
        return x

    execute_run(V1(name="A", resources={"t": tool}), RunInput("k", KEY_GROUP, 1, "in"), {},
                journal=writer(store).run_journal(KEY_GROUP))
    v2 = V2(name="A", resources={"t": tool})
    history = recover(store).history(key_digest("k"))
    run = RunInput("k", KEY_GROUP, 1, "in")
    if policy is FingerprintPolicy.FAIL:
        with pytest.raises(FingerprintMismatchError, match="other action code"):
            execute_run(v2, run, {}, history=history, fingerprint_policy=policy)
        return
    result = execute_run(v2, run, {}, history=history, fingerprint_policy=policy)
    assert result.stats.fingerprint_mismatches == 1
    expected = "v1" if policy is FingerprintPolicy.REUSE else "v2"
    assert [o.output for o in result.outputs] == [expected]


class Charged(Event):
    pass


def _shop(calls: Counter, *, with_notification: bool) -> Agent:
    """Charges a card (external), then answers; the second version adds a notification action and a changed
    answer, and leaves ``charge`` as it was."""

    def card(amount):
        calls["charge"] += 1
        return f"charged {amount}"

    class Shop(Agent):
        @action(InputEvent)
        def charge(event, ctx):
            ctx.send_event(Charged(receipt=ctx.call("card", event.input)))

        @action(Charged)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(output=event.receipt))

    class ShopWithNotification(Shop):
        @action(Charged)
        def answer(event, ctx):
            ctx.send_event(OutputEvent(output=event.receipt.upper()))

        @action(InputEvent)
        def notify(event, ctx):
            ctx.call("mail", event.input)

    kind = ShopWithNotification if with_notification else Shop
    return kind(name="shop", resources={"card": Tool(card, side_effects="external"),
                                        "mail": Tool(lambda text: calls.update(["mail"]), side_effects="external")})


def test_a_deploy_that_adds_an_action_re_executes_only_the_changed_ones_under_re_execute():
    """Issue 35: fingerprints are per action. Before, adding ``notify`` changed the fingerprint of every action,
    and ``re-execute`` charged the card again on the unchanged ``charge``. The new action, which has no record
    under the journaled input, is no divergence either: the key's next input still reuses its charge."""
    calls, store = Counter(), MemoryJournalStore(4)
    runs = [RunInput("k", KEY_GROUP, 1, 40), RunInput("k", KEY_GROUP, 2, 7)]
    for run in runs:
        execute_run(_shop(calls, with_notification=False), run, {}, journal=writer(store).run_journal(KEY_GROUP))
    before = {spec.name: spec.fingerprint for spec in _shop(calls, with_notification=False).actions}
    deployed = _shop(calls, with_notification=True)
    after = {spec.name: spec.fingerprint for spec in deployed.actions}
    assert after["charge"] == before["charge"] and after["answer"] != before["answer"]

    history = recover(store).history(key_digest("k"))
    results = [execute_run(deployed, run, {}, history=history, fingerprint_policy=FingerprintPolicy.RE_EXECUTE)
               for run in runs]
    assert calls == Counter({"charge": 2, "mail": 2})  # each card charged once; the new action ran per input
    assert [o.output for result in results for o in result.outputs] == ["CHARGED 40", "CHARGED 7"]
    stats = [(r.stats.fingerprint_mismatches, r.stats.actions_reused, r.stats.divergences) for r in results]
    assert stats == [(1, 1, 0), (1, 1, 0)]  # answer re-executed, charge reused, nothing dropped


def test_a_completion_journaled_with_0_6_0s_whole_agent_fingerprint_still_matches_the_same_code():
    spec = _shop(Counter(), with_notification=False).actions[0]
    assert spec.whole_agent_fingerprint != spec.fingerprint  # two actions: the wiring of both counted in 0.5.1
    assert spec.wrote(spec.whole_agent_fingerprint) and spec.wrote(spec.fingerprint)
    other = _shop(Counter(), with_notification=True).actions[0]  # the same charge, another agent around it
    assert other.wrote(spec.fingerprint) and not other.wrote(spec.whole_agent_fingerprint)


def test_records_of_another_producer_are_rejected():
    store = MemoryJournalStore(8)
    run_inputs(make_agent(Counter()), INPUTS[:1], writer(store, producer="job-a"))
    index = recover(store, producer="job-b")  # records are verified when their key first replays
    with pytest.raises(SignatureError, match="written by 'job-a'"):
        index.history(key_digest("k1"))


@pytest.mark.parametrize("durability", list(Durability))
def test_every_durability_mode_journals_the_same_records(durability):
    store = MemoryJournalStore(8)
    run_inputs(make_agent(Counter()), INPUTS, writer(store, durability))
    assert len(store.records(KEY_GROUP)) == 30


@pytest.mark.parametrize("bad_key", [b"not-a-journal-key", None, b"\xff\xfe"])
def test_foreign_record_keys_are_rejected_at_recovery(bad_key):
    store = MemoryJournalStore(8)
    run_inputs(make_agent(Counter()), INPUTS[:1], writer(store))
    store.append(KEY_GROUP, bad_key, b"value")
    with pytest.raises(SignatureError, match="not a flink-agents-replay journal key"):
        recover(store)


def test_cancelled_run_stops_at_the_next_call_and_the_next_attempt_reuses_what_it_did():
    from flink_agents_replay.engine import RunCancelled

    calls, store = Counter(), MemoryJournalStore(8)
    agent = make_agent(calls)
    stop_after = {"n": 3}

    def cancelled():
        return sum(calls.values()) >= stop_after["n"]

    with pytest.raises(RunCancelled, match="operator is closing"):
        execute_run(agent, RunInput("k1", KEY_GROUP, 1, "a"), {}, journal=writer(store).run_journal(KEY_GROUP),
                    cancelled=cancelled)
    assert sum(calls.values()) == 3
    result = execute_run(agent, RunInput("k1", KEY_GROUP, 1, "a"), {}, history=recover(store).history(key_digest("k1")),
                         journal=writer(store).run_journal(KEY_GROUP))
    assert sum(calls.values()) == 6 and result.stats.calls_reused + result.stats.actions_reused > 0


class _WatchedDelivery:
    """A delivery that notes being waited for, and may run a hook then (a close arriving meanwhile)."""

    def __init__(self, inner, waited: list, on_wait=None):
        self._inner, self._waited, self._on_wait = inner, waited, on_wait

    def wait(self, timeout_s: float) -> int:
        self._waited.append(self)
        if self._on_wait is not None:
            self._on_wait()
        return self._inner.wait(timeout_s)

    def done(self) -> bool:
        return self._inner.done()


class _WatchedStore(MemoryJournalStore):
    """Every delivery it hands out is watched: ``deliveries`` and ``waited`` tell which were waited for."""

    def __init__(self, partitions: int, on_wait=None):
        super().__init__(partitions)
        self.deliveries, self.waited, self.on_wait = [], [], on_wait

    def append(self, partition: int, key: bytes, value: bytes):
        delivery = _WatchedDelivery(super().append(partition, key, value), self.waited, self.on_wait)
        self.deliveries.append(delivery)
        return delivery


def test_a_cancelled_run_waits_for_the_records_of_the_calls_it_made():
    """Stopped at a boundary by a closing operator, a run's last call records may still be queued (per_action
    acknowledges at completions): they are the only trace of calls that were made, so the run waits for them
    before it stops, inside the operator's close_timeout_s, not leaving them to the store's bounded close."""
    from flink_agents_replay.engine import RunCancelled

    calls, store = Counter(), _WatchedStore(8)
    with pytest.raises(RunCancelled):
        execute_run(make_agent(calls), RunInput("k1", KEY_GROUP, 1, "a"), {},
                    journal=writer(store).run_journal(KEY_GROUP), cancelled=lambda: sum(calls.values()) >= 3)
    assert sum(calls.values()) == 3
    assert store.deliveries and set(map(id, store.waited)) == set(map(id, store.deliveries))


def test_a_run_cancelled_while_its_started_record_is_acknowledged_does_not_make_the_call():
    """The operator closes while an external call waits for its 'started' record: the call must not be made
    after the close (the next attempt finds it in doubt and its policy decides, alone)."""
    from flink_agents_replay.engine import RunCancelled

    closing = threading.Event()
    invoked = []

    class Sends(Agent):
        @action(InputEvent)
        def send(event, ctx):
            ctx.send_event(OutputEvent(output=ctx.call("mail", event.input)))

    agent = Sends(resources={"mail": Tool(lambda text: invoked.append(text) or "sent", side_effects="external")})
    store = _WatchedStore(8, on_wait=closing.set)  # the close arrives while the run waits for an ack
    with pytest.raises(RunCancelled, match="operator is closing"):
        execute_run(agent, RunInput("k1", KEY_GROUP, 1, "a"), {}, journal=writer(store).run_journal(KEY_GROUP),
                    cancelled=closing.is_set)
    assert closing.is_set() and invoked == []


@pytest.mark.parametrize("durability", [Durability.PER_RUN, Durability.AT_CHECKPOINT, Durability.PER_ACTION])
def test_a_run_goes_on_past_an_external_call_only_once_its_outcome_is_acknowledged(durability):
    """A tool loop's next model turn (no side effects, no 'started' record of its own) is made only once the
    external tool's outcome is acknowledged: a crash after the run went on past the tool never makes it again."""
    store = _WatchedStore(8)
    seen_at_the_model: list[tuple[int, int]] = []

    def model(text):
        seen_at_the_model.append((len(store.deliveries), len({id(d) for d in store.waited})))
        return f"answer to {text}"

    class Loop(Agent):
        @action(InputEvent)
        def turn(event, ctx):
            found = ctx.call("find_order", event.input)
            ctx.send_event(OutputEvent(output=ctx.call("llm", found)))

    agent = Loop(resources={"find_order": Tool(lambda order: {"order": order}, side_effects="external"),
                            "llm": Tool(model, side_effects="none")})
    execute_run(agent, RunInput("k1", KEY_GROUP, 1, "O-1"), {},
                journal=writer(store, durability).run_journal(KEY_GROUP))
    [(written, waited)] = seen_at_the_model
    assert written >= 2 and waited == written  # the tool's 'started' and 'returned' records among them


def test_calls_without_side_effects_wait_for_no_acknowledgement_of_their_own():
    """The wait is owed to external calls only: calls without side effects go on without one (per_run)."""
    store = _WatchedStore(8)
    waits_at_each_call: list[int] = []

    def lookup(text):
        waits_at_each_call.append(len(store.waited))
        return text.upper()

    class Reads(Agent):
        @action(InputEvent)
        def read(event, ctx):
            ctx.send_event(OutputEvent(output=[ctx.call("lookup", f"{event.input}{n}") for n in range(3)]))

    agent = Reads(resources={"lookup": Tool(lookup, side_effects="none")})
    execute_run(agent, RunInput("k1", KEY_GROUP, 1, "a"), {},
                journal=writer(store, Durability.PER_RUN).run_journal(KEY_GROUP))
    assert waits_at_each_call == [0, 0, 0] and len(store.deliveries) >= 3


class _HeldDelivery:
    """A delivery acknowledged only when the test says so; ``waiting`` counts the threads waiting for it."""

    def __init__(self, someone_waits: threading.Event):
        self.acknowledged, self.waiting, self._someone_waits = threading.Event(), 0, someone_waits

    def wait(self, timeout_s: float) -> int:
        self.waiting += 1
        self._someone_waits.set()
        if not self.acknowledged.wait(timeout_s):
            raise TimeoutError("not acknowledged")
        return 0

    def done(self) -> bool:
        return self.acknowledged.is_set()

    def add_done_callback(self, callback):
        raise AssertionError("not used here")


class _HeldStore(MemoryJournalStore):
    def __init__(self, partitions: int):
        super().__init__(partitions)
        self.held: list[_HeldDelivery] = []
        self.someone_waits = threading.Event()

    def append(self, partition: int, key: bytes, value: bytes):
        super().append(partition, key, value)
        self.held.append(_HeldDelivery(self.someone_waits))
        return self.held[-1]


def test_a_thread_acknowledging_while_another_waits_still_waits_for_every_record_of_the_run():
    """Sub-agent calls of one run write from several threads. A thread's 'started' record is appended; another
    thread's acknowledgement begins (it waits for every record so far, this one too); this thread's own wait must
    still wait for its record, not return because the other took the list."""
    from flink_agents_replay.storage.records.journal import RecordKind

    store = _HeldStore(8)
    journal = writer(store, Durability.PER_RUN).run_journal(KEY_GROUP)
    journal._writer.encode = lambda *args, **options: b"record"  # acknowledgements are the point, not bytes
    journal.write(b"k", RecordKind.CALL, None, ack_before_next_call=True)  # an external call's outcome
    journal.write(b"k", RecordKind.CALL, None)  # this thread's 'started' record, appended, its wait to come
    other = threading.Thread(target=journal.acknowledge)
    other.start()
    assert store.someone_waits.wait(5)
    store.someone_waits.clear()
    finished = threading.Event()
    mine = threading.Thread(target=lambda: (journal.acknowledge(), finished.set()))
    mine.start()
    while not (store.someone_waits.is_set() or finished.is_set()):
        mine.join(0.001)
    assert not finished.is_set() and store.held[0].waiting == 2  # this thread waits too, for the same records
    for delivery in store.held:
        delivery.acknowledged.set()
    mine.join(5)
    other.join(5)
    assert finished.is_set() and journal.acknowledged()


class _LocalEmbedder:
    """The local model service's hashed bag of words, without the service."""

    def embed(self, texts):
        from flink_agents_replay.local.embeddings import embed
        return [embed(text) for text in texts]


def test_a_memory_write_waits_until_what_the_run_read_before_it_is_acknowledged():
    """search -> model -> add, then a crash that loses the unacknowledged search record: the restored run would
    search again and find the memory its own earlier attempt added, so its prompt, its model call and its output
    would differ (CI's demo: 217 model calls, one of them new). The write waits for the run's earlier records;
    the read and the model call wait for none."""
    from flink_agents_replay.longterm import InMemoryVectorStore, LongTermMemory

    store = _WatchedStore(8)
    unacknowledged_at: dict[str, int] = {}

    class Watched(InMemoryVectorStore):
        def upsert(self, namespace, docs):
            unacknowledged_at.setdefault("add", len(store.deliveries) - len({id(d) for d in store.waited}))
            super().upsert(namespace, docs)

        def query(self, *args, **kwargs):
            unacknowledged_at.setdefault("search", len(store.deliveries) - len({id(d) for d in store.waited}))
            return super().query(*args, **kwargs)

    def model(past):
        unacknowledged_at.setdefault("model", len(store.deliveries) - len({id(d) for d in store.waited}))
        return f"reply mentioning {len(past)} past issues"

    class Remembers(Agent):
        @action(InputEvent)
        def reply(event, ctx):
            found = ctx.call("memory", "search", event.input)["results"]
            answer = ctx.call("llm", [hit["memory"] for hit in found])
            ctx.call("memory", "add", event.input)
            ctx.send_event(OutputEvent(output=answer))

    agent = Remembers(resources={"memory": LongTermMemory(Watched(), _LocalEmbedder()),
                                 "llm": Tool(model, side_effects="none")})
    execute_run(agent, RunInput("k1", KEY_GROUP, 1, "parcel late"), {},
                journal=writer(store, Durability.PER_RUN).run_journal(KEY_GROUP))
    assert unacknowledged_at["add"] == 0
    assert unacknowledged_at["model"] >= 1  # the search's record was still travelling: reads do not wait


def test_a_call_with_side_effects_is_by_default_a_write_and_waits_for_what_was_read_before():
    """An idempotent tool (an upsert) may change what an earlier read finds: it waits like a memory write."""
    store = _WatchedStore(8)
    unacknowledged_at_upsert: list[int] = []

    def upsert(status):
        unacknowledged_at_upsert.append(len(store.deliveries) - len({id(d) for d in store.waited}))
        return "ok"

    class Updates(Agent):
        @action(InputEvent)
        def update(event, ctx):
            status = ctx.call("read_status", event.input)
            ctx.send_event(OutputEvent(output=ctx.call("set_status", f"{status}+1")))

    agent = Updates(resources={"read_status": Tool(lambda order: "open", side_effects="none"),
                               "set_status": Tool(upsert, side_effects="idempotent")})
    execute_run(agent, RunInput("k1", KEY_GROUP, 1, "O-1"), {},
                journal=writer(store, Durability.PER_RUN).run_journal(KEY_GROUP))
    assert unacknowledged_at_upsert == [0] and len(store.deliveries) >= 2
