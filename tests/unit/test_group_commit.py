"""Group commit: a run waits for no acknowledgement except the started record of an external call, and the
operator releases its outputs by the durability mode without blocking (journal/writer.py, flink/runs.py)."""

import threading
from concurrent.futures import Future

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.flink.runs import RunPool
from flink_agents_replay.storage.journal.checkpoints import RunInFlight
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.store import Delivery
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec

KEY_GROUP = 2
SIGNING_KEY = b"0123456789abcdef0123"


class _Held(Delivery):
    """A delivery the test answers: it stays unacknowledged until ``answer`` (a broker round trip in flight)."""

    def __init__(self, store: "_HeldStore", offset: int):
        self._store, self.offset, self.error = store, offset, None
        self._answered = threading.Event()
        self._callbacks: list = []

    def answer(self, error: str | None = None) -> None:
        self.error = error
        self._answered.set()
        while self._callbacks:
            self._callbacks.pop(0)()

    def done(self) -> bool:
        return self._answered.is_set()

    def add_done_callback(self, callback) -> None:
        if self.done():
            callback()
        else:
            self._callbacks.append(callback)

    def wait(self, timeout_s: float) -> int:
        self._store.waits.append(self)
        if self._store.answer_on_wait:
            self.answer()
        if not self._answered.wait(timeout_s):
            raise JournalError("not acknowledged in time")
        if self.error is not None:
            raise JournalError(self.error)
        return self.offset


class _HeldStore(MemoryJournalStore):
    """Appends land in memory, but their acknowledgements wait for the test (or for a wait, if it answers then)."""

    def __init__(self, *, answer_on_wait: bool = True):
        super().__init__(8)
        self.answer_on_wait = answer_on_wait
        self.deliveries: list[_Held] = []
        self.waits: list[_Held] = []

    def append(self, partition: int, key: bytes, value: bytes) -> Delivery:
        offset = super().append(partition, key, value).wait(0)
        self.deliveries.append(_Held(self, offset))
        return self.deliveries[-1]


def _agent(side_effects: str = "none") -> Agent:
    class TwoSteps(Agent):
        @action(InputEvent)
        def first(event, ctx):
            ctx.memory.set("a", ctx.call("tool", event.input))
            ctx.send_event(OutputEvent(output=ctx.call("tool", "again")))

    return TwoSteps(resources={"tool": Tool(lambda text: f"<{text}>", side_effects=side_effects)})


def _run(store: _HeldStore, durability: str, *, side_effects: str = "none", acknowledge: bool = False):
    journal = JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), durability).run_journal(KEY_GROUP)
    result = execute_run(_agent(side_effects), RunInput("k", KEY_GROUP, 1, "x"), {}, journal=journal,
                         acknowledge=acknowledge)
    return result, journal


@pytest.mark.parametrize("durability", ["per_run", "at_checkpoint"])
def test_a_run_of_plain_calls_waits_for_no_acknowledgement(durability):
    store = _HeldStore(answer_on_wait=False)  # a wait would hang until its timeout: none may happen
    result, journal = _run(store, durability)
    assert [o.output for o in result.outputs] == ["<again>"]
    assert len(store.deliveries) == 4 and store.waits == []  # accepted, 2 calls, completion: all in flight
    assert journal.outputs_may_leave() is (durability == "at_checkpoint")


def test_per_run_releases_outputs_once_every_record_is_acknowledged():
    store = _HeldStore(answer_on_wait=False)
    _, journal = _run(store, "per_run")
    for delivery in store.deliveries[:-1]:
        delivery.answer()
        assert not journal.outputs_may_leave()
    store.deliveries[-1].answer()
    assert journal.outputs_may_leave() and store.waits == store.deliveries  # each checked once it was answered


def test_a_failed_record_fails_the_release_instead_of_letting_outputs_leave():
    store = _HeldStore(answer_on_wait=False)
    _, journal = _run(store, "per_run")
    for delivery in store.deliveries:
        delivery.answer("Kafka rejected a record of the journal topic: broker gone")
    with pytest.raises(JournalError, match="broker gone"):
        journal.outputs_may_leave()


def test_an_external_call_still_waits_for_its_started_record_and_nothing_else():
    store = _HeldStore()
    _run(store, "per_run", side_effects="external")
    # accepted, started, result, started, result, completion: each started record was waited for, with what
    # came before it; the last result and the completion were not.
    assert len(store.deliveries) == 6 and store.waits == store.deliveries[:4]


def test_per_action_still_waits_at_the_completion():
    store = _HeldStore()
    _run(store, "per_action")
    assert store.waits and store.waits[-1] is store.deliveries[-1]


def test_per_bundle_is_the_old_name_of_per_run():
    assert Durability("per_bundle") is Durability.PER_RUN
    with pytest.raises(ValueError):
        Durability("per_nothing")


def _pool(max_runs: int = 1, slot_wait_timeout_s: float = 1.0) -> RunPool:
    class _Counter:
        def inc(self, n: int = 1) -> None:
            pass

    return RunPool(max_runs=max_runs, max_child_calls=1, slot_wait_timeout_s=slot_wait_timeout_s,
                   close_timeout_s=1.0, subtask=0, counters={"runs_abandoned": _Counter()})


def _submit_run(pool: RunPool, store: _HeldStore) -> None:
    """Submit key k1's run of the two-step agent, journaling per_run into ``store`` and not waiting at its end."""
    journal = JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), "per_run").run_journal(KEY_GROUP)
    pool.submit("k1", RunInFlight(KEY_GROUP, "d1", 1, journal),
                lambda: execute_run(_agent(), RunInput("k1", KEY_GROUP, 1, "x"), {}, journal=journal,
                                    acknowledge=False))


def test_a_finished_run_frees_its_slot_before_its_records_are_acknowledged():
    """With one slot, the next key's run starts while the first run's acknowledgements are in flight; the first
    run's outputs leave only once they arrive."""
    store = _HeldStore(answer_on_wait=False)
    pool = _pool()
    try:
        _submit_run(pool, store)
        second: Future = Future()
        pool.submit("k2", RunInFlight(KEY_GROUP, "d2", 1, None), lambda: second.set_result("ran") or None)
        assert second.result(timeout=5) == "ran"  # the only slot was free again
        assert not pool.done("k1")
        for delivery in store.deliveries:
            delivery.answer()
        assert pool.done("k1") and pool.finished("k1").outputs[0].output == "<again>"
    finally:
        pool.close()


def test_draining_waits_for_the_acknowledgements():
    store = _HeldStore(answer_on_wait=True)
    pool = _pool()
    try:
        _submit_run(pool, store)
        assert pool.done("k1", wait_for_it=True)
        assert all(d.done() for d in store.deliveries) and len(store.deliveries) == 4
    finally:
        pool.close()


def _submit_watched_run(pool: RunPool, store: _HeldStore, durability: str, ready: threading.Event, *,
                        fail: bool = False) -> None:
    """Submit key k1's run (failing at once with ``fail``), with ``ready`` set by its ``on_ready``."""
    journal = JournalWriter(store, RecordCodec(SIGNING_KEY, "op"), durability).run_journal(KEY_GROUP)

    def execute():
        if fail:
            raise RuntimeError("the action failed")
        return execute_run(_agent(), RunInput("k1", KEY_GROUP, 1, "x"), {}, journal=journal, acknowledge=False)

    pool.submit("k1", RunInFlight(KEY_GROUP, "d1", 1, journal), execute, on_ready=ready.set)


def _wait_until_ended(pool: RunPool, key: str) -> None:
    pool._runs[key].future.exception(timeout=5)  # the run returned (or raised), whatever its journal says


def test_on_ready_comes_with_the_last_acknowledgement_not_before():
    """The wake-up of a per_run run: called by the thread delivering the last acknowledgement, once."""
    store, pool, ready = _HeldStore(answer_on_wait=False), _pool(), threading.Event()
    try:
        _submit_watched_run(pool, store, "per_run", ready)
        _wait_until_ended(pool, "k1")
        for delivery in store.deliveries[:-1]:
            delivery.answer()
        assert not ready.is_set() and not pool.done("k1")
        store.deliveries[-1].answer()
        assert ready.is_set() and pool.done("k1")
    finally:
        pool.close()


@pytest.mark.parametrize("durability, fail", [("at_checkpoint", False), ("per_run", True)])
def test_on_ready_comes_when_the_run_ends_if_nothing_is_to_be_acknowledged(durability, fail):
    store, pool, ready = _HeldStore(answer_on_wait=False), _pool(), threading.Event()
    try:
        _submit_watched_run(pool, store, durability, ready, fail=fail)
        assert ready.wait(5) and pool.done("k1")
        assert not any(d.done() for d in store.deliveries)  # no acknowledgement arrived, none was needed
    finally:
        pool.close()


def test_on_ready_comes_when_a_record_failed_so_the_failure_is_found():
    store, pool, ready = _HeldStore(answer_on_wait=False), _pool(), threading.Event()
    try:
        _submit_watched_run(pool, store, "per_run", ready)
        _wait_until_ended(pool, "k1")
        for delivery in store.deliveries:
            delivery.answer("Kafka rejected a record of the journal topic: broker gone")
        assert ready.is_set()
        with pytest.raises(JournalError, match="broker gone"):
            pool.done("k1")
    finally:
        pool.close()
