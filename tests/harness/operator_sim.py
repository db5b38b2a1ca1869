"""The real :class:`~flink_agents_replay.flink.operator.ActionExecutionOperator`, driven without Flink.

A deterministic stand-in for what a TaskManager gives the operator, so that unit tests can drive the operator
through inputs, decisions, timers, checkpoints and failovers step by step, in any interleaving:

* **Keyed state** (:class:`KeyedBackend`): value, list and map state per state name and *current key*, as Flink's
  heap backend keeps it; copied whole at a checkpoint (:meth:`OperatorSim.checkpoint`) and restored into a new
  operator instance (:meth:`SimWorld.operator` with ``restore=``), as a restore from a checkpoint does.
* **Timers** (:class:`_TimerService`): processing-time and event-time timers per key, kept as Flink keeps them
  (one timer per key and timestamp: registering it again is a no-op, deleting it deletes it whatever registered
  it), part of the checkpoint. Processing time is the world's clock (:class:`SimClock`), which moves only when a
  test advances it, so deadlines and check timers fire exactly when the test says.
* **The clock** the operator, its waits and the engine read (``time.time()`` in ``flink/operator.py``,
  ``flink/waits.py``, ``engine/calls.py`` ...): the same :class:`SimClock`, patched into those modules for the
  world's lifetime (:class:`SimWorld` is a context manager).
* **Completion wake-ups**: the Python half is the package's own :class:`CompletionWakeups` over a real pipe; the
  Java half (:class:`_JavaWakeups`) remembers each token's key and :meth:`OperatorSim.pump` fires ``on_timer``
  for it at the current processing time, from the test's thread, as the bridge's mail does. The input hold is
  honoured: an input is delivered only once the operator released it.
* **The journal**: an in-memory store shared by every operator of the world (:class:`SimJournalStore`), in place
  of Kafka, so records survive a simulated crash; the operator builds its writer, codec and recovery on it exactly
  as in production (``flink/parts.py``).
* **Checkpoint hooks** in the checkpoint bridge's order: ``open`` -> ``restored_checkpoint`` (on a restore) ->
  ``initialize_state(markers)`` -> ``attach_wakeups``; ``snapshot_state`` + a copy of keyed state and timers at a
  checkpoint, then ``notify_checkpoint_complete``.

Runs still execute on the operator's own thread pool (``flink/runs.py``). :meth:`OperatorSim.pump` waits (bounded,
on the wake-up pipe, never by sleeping) until every run under way was applied and no timer is due, so a test
observes one settled state after each step.
"""

from __future__ import annotations

import contextlib
import copy
import os
import select
import struct
import time as _real_time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from pyflink.datastream import OutputTag, TimeDomain

from flink_agents_replay.api.agent import Agent
from flink_agents_replay.engine import calls as engine_calls
from flink_agents_replay.flink import epochs as flink_epochs
from flink_agents_replay.flink import operator as flink_operator
from flink_agents_replay.flink import parts as flink_parts
from flink_agents_replay.flink import waits as flink_waits
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.flink.operator import ActionExecutionOperator, AgentOutput
from flink_agents_replay.flink.signals import KeyedInput, Signal, parse_signal
from flink_agents_replay.flink.waits import WaitEvent
from flink_agents_replay.storage.formats.state import decode_in_flight, decode_memory, decode_waiting
from flink_agents_replay.storage.journal import checkpoints as journal_checkpoints
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.waits import Decision

__all__ = ["Checkpoint", "KeyedBackend", "OperatorSim", "SimClock", "SimJournalStore", "SimWorld"]

#: A signing key for the simulated journal (16 characters at least).
SIGNING_KEY = "operator-sim-signing-key-0123456789"
#: The modules whose ``time.time()`` is the world's clock.
_CLOCKED_MODULES = (flink_operator, flink_waits, engine_calls, flink_epochs, journal_checkpoints)
_TOKEN = struct.Struct(">q")
_DRAIN_WATERMARK = 2**63 - 1


class SimClock:
    """Processing time in milliseconds, moved only by :meth:`advance` (or :meth:`set`)."""

    def __init__(self, start_ms: int):
        self.now_ms = start_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms

    def set(self, ms: int) -> None:
        if ms < self.now_ms:
            raise ValueError(f"processing time does not go back ({ms} < {self.now_ms})")
        self.now_ms = ms


class _TimeModule:
    """``time`` as the clocked modules see it: ``time()`` reads the world's clock, the rest is the real module."""

    def __init__(self, clock: SimClock):
        self._clock = clock

    def time(self) -> float:
        return self._clock.now_ms / 1000

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


class SimJournalStore(MemoryJournalStore):
    """The in-memory journal with what a Kafka topic also has: a name and a topic id. Survives "crashes"."""

    def __init__(self, partitions: int):
        super().__init__(partitions, topic="sim.journal")
        self.topic_id = "sim-topic-id"


# -- keyed state ------------------------------------------------------------------------------------------------
class KeyedBackend:
    """Keyed state and timers of one operator instance, by state name and key (a heap state backend)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[Any, Any]] = defaultdict(dict)
        self.lists: dict[str, dict[Any, list]] = defaultdict(dict)
        self.maps: dict[str, dict[Any, dict]] = defaultdict(dict)
        self.processing_timers: set[tuple[int, Any]] = set()  # (timestamp, key): one per key and time
        self.event_timers: set[tuple[int, Any]] = set()
        self.current_key: Any = None

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of everything a checkpoint keeps (state and timers)."""
        return copy.deepcopy({"values": dict(self.values), "lists": dict(self.lists), "maps": dict(self.maps),
                              "processing_timers": self.processing_timers, "event_timers": self.event_timers})

    @classmethod
    def restored(cls, snapshot: dict[str, Any]) -> KeyedBackend:
        backend = cls()
        copied = copy.deepcopy(snapshot)
        backend.values.update(copied["values"])
        backend.lists.update(copied["lists"])
        backend.maps.update(copied["maps"])
        backend.processing_timers = copied["processing_timers"]
        backend.event_timers = copied["event_timers"]
        return backend

    def _key(self) -> Any:
        if self.current_key is None:
            raise AssertionError("keyed state used with no current key (outside process_element/on_timer)")
        return self.current_key


class _ValueState:
    def __init__(self, backend: KeyedBackend, name: str):
        self._backend, self._name = backend, name

    def value(self):
        return self._backend.values[self._name].get(self._backend._key())

    def update(self, value) -> None:
        if value is None:
            self.clear()
        else:
            self._backend.values[self._name][self._backend._key()] = value

    def clear(self) -> None:
        self._backend.values[self._name].pop(self._backend._key(), None)


class _ListState:
    def __init__(self, backend: KeyedBackend, name: str):
        self._backend, self._name = backend, name

    def get(self):
        return list(self._backend.lists[self._name].get(self._backend._key(), []))

    def add(self, value) -> None:
        self._backend.lists[self._name].setdefault(self._backend._key(), []).append(value)

    def add_all(self, values) -> None:
        for value in values:
            self.add(value)

    def update(self, values) -> None:
        values = list(values or [])
        if values:
            self._backend.lists[self._name][self._backend._key()] = values
        else:
            self.clear()

    def clear(self) -> None:
        self._backend.lists[self._name].pop(self._backend._key(), None)


class _MapState:
    def __init__(self, backend: KeyedBackend, name: str):
        self._backend, self._name = backend, name

    def _map(self, create: bool = False) -> dict:
        maps = self._backend.maps[self._name]
        key = self._backend._key()
        if create:
            return maps.setdefault(key, {})
        return maps.get(key, {})

    def get(self, key):
        return self._map().get(key)

    def put(self, key, value) -> None:
        self._map(create=True)[key] = value

    def put_all(self, entries) -> None:
        self._map(create=True).update(entries)

    def remove(self, key) -> None:
        entries = self._map()
        entries.pop(key, None)
        if not entries:
            self._backend.maps[self._name].pop(self._backend._key(), None)

    def contains(self, key) -> bool:
        return key in self._map()

    def items(self):
        return list(self._map().items())

    def keys(self):
        return list(self._map().keys())

    def values(self):
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._map()

    def clear(self) -> None:
        self._backend.maps[self._name].pop(self._backend._key(), None)

    def __iter__(self):
        return iter(self.keys())


# -- metrics and the runtime context ----------------------------------------------------------------------------
class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n

    def dec(self, n: int = 1) -> None:
        self.count -= n

    def get_count(self) -> int:
        return self.count


class _MetricGroup:
    def __init__(self) -> None:
        self.counters: dict[str, _Counter] = {}
        self.groups: dict[str, _MetricGroup] = {}

    def add_group(self, name: str, extra: str | None = None) -> _MetricGroup:
        return self.groups.setdefault(name, _MetricGroup())

    def counter(self, name: str) -> _Counter:
        return self.counters.setdefault(name, _Counter())


class _JobId:
    def __init__(self, job_id: str):
        self._job_id = job_id

    def getJobInfo(self):  # noqa: N802 - the Java context's names
        return self

    def getJobId(self):  # noqa: N802
        return self

    def toString(self) -> str:  # noqa: N802
        return self._job_id


class _RuntimeContext:
    """What ``open`` reads of PyFlink's runtime context: state handles, metrics, the subtask and the job id."""

    def __init__(self, backend: KeyedBackend, *, max_parallelism: int, job_id: str, attempt: int):
        self._backend = backend
        self._max_parallelism = max_parallelism
        self._attempt = attempt
        self._runtime_context = _JobId(job_id)
        self.metrics = _MetricGroup()

    def get_state(self, descriptor) -> _ValueState:
        return _ValueState(self._backend, descriptor.get_name())

    def get_list_state(self, descriptor) -> _ListState:
        return _ListState(self._backend, descriptor.get_name())

    def get_map_state(self, descriptor) -> _MapState:
        return _MapState(self._backend, descriptor.get_name())

    def get_metrics_group(self) -> _MetricGroup:
        return self.metrics

    def get_index_of_this_subtask(self) -> int:
        return 0

    def get_number_of_parallel_subtasks(self) -> int:
        return 1

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self._max_parallelism

    def get_attempt_number(self) -> int:
        return self._attempt


class _TimerService:
    def __init__(self, backend: KeyedBackend, clock: SimClock):
        self._backend, self._clock = backend, clock

    def current_processing_time(self) -> int:
        return self._clock.now_ms

    def current_watermark(self) -> int:
        return -(2**63)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._backend.processing_timers.add((int(timestamp), self._backend._key()))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._backend.processing_timers.discard((int(timestamp), self._backend._key()))

    def register_event_time_timer(self, timestamp: int) -> None:
        self._backend.event_timers.add((int(timestamp), self._backend._key()))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._backend.event_timers.discard((int(timestamp), self._backend._key()))


class _Context:
    """``ctx`` of ``process_element`` and ``on_timer``."""

    def __init__(self, backend: KeyedBackend, timers: _TimerService, *, timestamp: int | None = None,
                 domain: TimeDomain | None = None):
        self._backend, self._timers = backend, timers
        self._timestamp, self._domain = timestamp, domain

    def get_current_key(self):
        return self._backend.current_key

    def timestamp(self) -> int | None:
        return self._timestamp

    def timer_service(self) -> _TimerService:
        return self._timers

    def time_domain(self) -> TimeDomain:
        return self._domain


class _JavaWakeups:
    """The Java half of completion wake-ups and of the input hold (``checkpoint_bridge``), in Python."""

    def __init__(self, backend: KeyedBackend):
        self._backend = backend
        self.keys: dict[int, Any] = {}
        self.fd: int | None = None
        self._partial = b""
        self.held = False
        self.holds = 0

    def listen(self, read_fd: int) -> None:
        self.fd = os.dup(read_fd)  # the Python half closes its own descriptor of the pipe's read end
        os.set_blocking(self.fd, False)

    def remember(self, token: int) -> None:
        self.keys[token] = self._backend._key()

    def forget(self, token: int) -> None:
        self.keys.pop(token, None)

    def holdInput(self, timeout_ms: int) -> None:  # noqa: N802 - the Java method's name
        self.held = True
        self.holds += 1

    def releaseInput(self) -> None:  # noqa: N802
        self.held = False

    def woken(self, wait_s: float) -> list[Any]:
        """The keys of the tokens written to the pipe (waiting up to ``wait_s`` for one), in order."""
        if self.fd is None:
            return []
        ready, _, _ = select.select([self.fd], [], [], max(0.0, wait_s))
        if not ready:
            return []
        try:
            data = self._partial + os.read(self.fd, 4096)
        except BlockingIOError:
            return []
        whole = len(data) - len(data) % _TOKEN.size
        self._partial = data[whole:]
        tokens = [_TOKEN.unpack_from(data, i)[0] for i in range(0, whole, _TOKEN.size)]
        return [self.keys.pop(token) for token in tokens if token in self.keys]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# -- the world: clock, journal, patches ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A completed checkpoint: keyed state and timers as copied at the barrier, and the operator's marker(s)."""

    checkpoint_id: int
    state: dict[str, Any]
    markers: list[bytes]
    time_ms: int


class SimWorld(contextlib.AbstractContextManager):
    """One simulated job across its attempts: the clock, the journal, the job id; the operators it started.

    Use as a context manager: the clock is patched into the package's modules inside it, and every operator
    still open is closed at its end.
    """

    def __init__(self, *, partitions: int = 8, start_ms: int = 1_800_000_000_000, job_id: str = "sim-job"):
        self.partitions = partitions
        self.clock = SimClock(start_ms)
        self.store = SimJournalStore(partitions)
        self.job_id = job_id
        self.submission = "sim-submission-1"  # every attempt of one submission unpickles the same operator
        self.operators: list[OperatorSim] = []
        self._patches = contextlib.ExitStack()

    def __enter__(self) -> SimWorld:
        shim = _TimeModule(self.clock)
        for module in _CLOCKED_MODULES:
            self._patches.enter_context(_patched(module, "time", shim))
        self._patches.enter_context(_patched(flink_parts, "KafkaJournalStore", self._journal_store))
        # No fence topic: the in-memory journal has no broker to ask (tests/unit/test_fence_watch.py checks it).
        self._patches.enter_context(_patched(flink_parts, "FenceWatch", lambda *args, **kwargs: None))
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            for sim in self.operators:
                sim.crash()
        finally:
            self._patches.close()

    def _journal_store(self, settings, topic, max_parallelism, **options) -> SimJournalStore:
        if max_parallelism != self.partitions:
            raise AssertionError(f"the world's journal has {self.partitions} partitions, the config says "
                                 f"max_parallelism={max_parallelism}")
        return self.store

    def config(self, **settings) -> AgentConfig:
        """An :class:`AgentConfig` for this world (its journal, max parallelism, a signing key) with ``settings``."""
        base = {"kafka": {"bootstrap.servers": "sim:9092"}, "signing_key": SIGNING_KEY,
                "max_parallelism": self.partitions, "close_timeout_s": 10.0}
        return AgentConfig(**{**base, **settings})

    def operator(self, agent: Agent, config: AgentConfig, *, restore: Checkpoint | None = None,
                 key_type: str = "STRING") -> OperatorSim:
        """A new operator instance (a new attempt of the task): fresh, or restored from ``restore``."""
        sim = OperatorSim(self, agent, config.resolved(agent.name), key_type=key_type, restore=restore,
                          attempt=len(self.operators))
        self.operators.append(sim)
        return sim

    def resubmit(self) -> None:
        """The job submitted again (its operator built again): later operators are of the new submission."""
        self.submission = f"sim-submission-{int(self.submission.rsplit('-', 1)[1]) + 1}"

    def advance(self, ms: int) -> int:
        """Move processing time on (timers then fire at the next :meth:`OperatorSim.pump`)."""
        return self.clock.advance(ms)


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


# -- one operator instance ----------------------------------------------------------------------------------------
@dataclass
class _Seen:
    outputs: list[AgentOutput] = field(default_factory=list)
    events: list[WaitEvent] = field(default_factory=list)


class OperatorSim:
    """One attempt of the agent's task: the real operator, opened on simulated state, timers and wake-ups.

    Everything is driven from the calling thread (the "task thread"): :meth:`send`, :meth:`decide`,
    :meth:`pump`, :meth:`checkpoint`, :meth:`crash`. What the operator emits is collected in :attr:`outputs`
    (``AgentOutput``) and :attr:`events` (``WaitEvent`` s of the side output), in emission order.
    """

    def __init__(self, world: SimWorld, agent: Agent, config: AgentConfig, *, key_type: str,
                 restore: Checkpoint | None, attempt: int):
        self.world = world
        self.config = config
        self.backend = KeyedBackend.restored(restore.state) if restore is not None else KeyedBackend()
        self.timers = _TimerService(self.backend, world.clock)
        self.runtime_context = _RuntimeContext(self.backend, max_parallelism=config.max_parallelism,
                                               job_id=world.job_id, attempt=attempt)
        self.java = _JavaWakeups(self.backend)
        self.seen = _Seen()
        self.closed = False
        self.op = ActionExecutionOperator(agent, config, key_type)
        self.op.submission = world.submission
        self.op.open(self.runtime_context)
        if restore is not None:
            self.op.restored_checkpoint(restore.checkpoint_id)
        self.op.initialize_state(list(restore.markers) if restore is not None else [])
        self.op.attach_wakeups(self.java)

    # -- what came out -------------------------------------------------------------------------------------------
    @property
    def outputs(self) -> list[AgentOutput]:
        return self.seen.outputs

    @property
    def events(self) -> list[WaitEvent]:
        return self.seen.events

    def _collect(self, emitted) -> list[Any]:
        produced = []
        for item in emitted:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], OutputTag):
                if item[0].tag_id != flink_operator.WAIT_EVENTS_TAG_NAME:
                    raise AssertionError(f"an output to an unknown side output {item[0].tag_id!r}")
                self.seen.events.append(item[1])
            elif isinstance(item, AgentOutput):
                self.seen.outputs.append(item)
            else:
                raise AssertionError(f"the operator emitted {item!r}, neither an AgentOutput nor a wait event")
            produced.append(item)
        return produced

    # -- the task thread's work ----------------------------------------------------------------------------------
    def _at(self, key: Any) -> None:
        self.backend.current_key = key

    def _element(self, key: Any, value: Any, timestamp: int | None) -> list[Any]:
        if self.closed:
            raise AssertionError("this operator instance crashed or closed")
        deadline = _real_time.monotonic() + 10
        while self.java.held:  # the bridge takes no input while the operator holds it: it runs mails instead
            if _real_time.monotonic() > deadline:
                raise AssertionError("the operator held its input for 10 s")
            self._step(wait_s=0.05)
        self._at(key)
        try:
            return self._collect(self.op.process_element(value, _Context(self.backend, self.timers,
                                                                         timestamp=timestamp)))
        finally:
            self._at(None)

    def send(self, key: Any, value: Any, *, timestamp: int | None = None) -> list[Any]:
        """An input of ``key``, as ``connect_to_agent(signals=...)`` hands it to the operator."""
        return self._element(key, KeyedInput(key, value), timestamp)

    def decide(self, key: Any, wait_id: str, decision: Decision, *, signal_id: str | None = None) -> list[Any]:
        """A decision for the wait ``wait_id`` of ``key``."""
        return self._element(key, Signal(key, wait_id, decision, signal_id), None)

    def decide_raw(self, key: Any, raw: Any) -> list[Any]:
        """A decision as read from its topic (parsed as the pipeline parses it; may be malformed)."""
        return self._element(key, parse_signal(key, raw), None)

    def fire(self, key: Any, timestamp: int, *, domain: TimeDomain = TimeDomain.PROCESSING_TIME,
             registered: bool = True) -> list[Any]:
        """Fire ``on_timer(timestamp)`` for ``key`` now: a registered timer (taken out first, as Flink does), or
        with ``registered=False`` a timer built on the spot (the bridge's wake-up mail; nothing registered goes)."""
        if registered:
            timers = self.backend.event_timers if domain == TimeDomain.EVENT_TIME else self.backend.processing_timers
            timers.discard((timestamp, key))
        self._at(key)
        try:
            return self._collect(self.op.on_timer(timestamp, _Context(self.backend, self.timers, timestamp=timestamp,
                                                                      domain=domain)))
        finally:
            self._at(None)

    def deliver_wakeups(self, wait_s: float = 0.0) -> int:
        """Fire ``on_timer`` at the current processing time for each key woken so far (the bridge's mail)."""
        keys = self.java.woken(wait_s)
        for key in keys:
            self.fire(key, self.world.clock.now_ms, registered=False)
        return len(keys)

    def fire_due_timers(self) -> int:
        """Fire every processing-time timer due at the current processing time, earliest first."""
        fired = 0
        while True:
            due = sorted((t for t in self.backend.processing_timers if t[0] <= self.world.clock.now_ms),
                         key=lambda t: (t[0], repr(t[1])))
            if not due:
                return fired
            timestamp, key = due[0]
            self.fire(key, timestamp)
            fired += 1

    def _step(self, wait_s: float) -> bool:
        return bool(self.deliver_wakeups(wait_s) or self.fire_due_timers())

    def runs_under_way(self) -> list[Any]:
        """Keys with a run submitted and not yet applied (in this attempt)."""
        return list(self.op.runs._runs)

    def pump(self, *, timeout_s: float = 10.0) -> None:
        """Run the task's mails until quiet: every run under way applied, no timer due. Bounded: an
        ``AssertionError`` names the keys still under way after ``timeout_s`` (a run that never ends)."""
        deadline = _real_time.monotonic() + timeout_s
        while True:
            if self._step(wait_s=0.0):
                continue
            under_way = self.runs_under_way()
            if not under_way:
                return
            remaining = deadline - _real_time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"runs of keys {under_way} still under way after {timeout_s} s")
            self._step(wait_s=min(remaining, 0.25))

    def advance(self, ms: int) -> None:
        """Move processing time on by ``ms`` and pump (due timers fire)."""
        self.world.advance(ms)
        self.pump()

    def wait_run_done(self, key: Any, *, timeout_s: float = 10.0) -> None:
        """Wait (bounded) until ``key``'s run under way has ended and may be applied, without applying it."""
        running = self.op.runs._runs.get(key)
        if running is None:
            raise AssertionError(f"key {key!r} has no run under way")
        wait_futures([running.future], timeout=timeout_s)
        deadline = _real_time.monotonic() + timeout_s
        while not self.op.runs.done(key):
            if _real_time.monotonic() > deadline:
                raise AssertionError(f"the run of key {key!r} did not end within {timeout_s} s")
            select.select([], [], [], 0.005)

    def end_of_input(self) -> None:
        """The final watermark of a bounded input: every event-time timer fires (the operator's drain)."""
        while self.backend.event_timers:
            timestamp, key = min(self.backend.event_timers, key=lambda t: (t[0], repr(t[1])))
            self.fire(key, timestamp, domain=TimeDomain.EVENT_TIME)
        self.pump()

    # -- checkpoints and failures --------------------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: int, *, complete: bool = True) -> Checkpoint:
        """A checkpoint between two elements: the marker (``snapshot_state``) and a copy of keyed state and timers;
        then, with ``complete``, ``notify_checkpoint_complete`` (the journal prunes)."""
        now = self.world.clock.now_ms
        marker = self.op.snapshot_state(checkpoint_id, now)
        taken = Checkpoint(checkpoint_id, self.backend.snapshot(), [marker] if marker is not None else [], now)
        if complete:
            self.op.notify_checkpoint_complete(checkpoint_id)
        return taken

    def crash(self) -> None:
        """The task fails: the operator closes (its runs stop at their next boundary, the journal closes)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.op.close()
        finally:
            self.java.close()

    # -- what the state holds --------------------------------------------------------------------------------------
    def _value(self, name: str, key: Any) -> Any:
        return self.backend.values[name].get(key)

    def memory(self, key: Any) -> dict:
        raw = self._value("memory", key)
        return decode_memory(raw) if raw is not None else {}

    def accepted_seq(self, key: Any) -> int:
        return self._value("seq", key) or 0

    def in_flight_seq(self, key: Any) -> int | None:
        raw = self._value("in_flight", key)
        return None if raw is None else decode_in_flight(raw).seq

    def pending(self, key: Any) -> list[Any]:
        return [decode_waiting(raw).value for raw in self.backend.lists["pending"].get(key, [])]

    def parked(self, key: Any) -> list[int]:
        """The seqs of ``key``'s parked runs."""
        return sorted(self.backend.maps["parked_runs"].get(key, {}))

    def count(self, name: str) -> int:
        return self.op.counters[name].count

    def outputs_of(self, key: Any) -> list[AgentOutput]:
        return [output for output in self.outputs if output.key == key]

    def events_of(self, kind: str, key: Any = None) -> list[WaitEvent]:
        return [event for event in self.events if event.kind == kind and (key is None or event.key == key)]

    def wait_id(self, key: Any, seq: int) -> str:
        """The id of the wait ``key``'s run ``seq`` opened last (from its ``opened`` event)."""
        opened = [event for event in self.events_of("opened", key) if event.seq == seq]
        if not opened:
            raise AssertionError(f"run {seq} of key {key!r} opened no wait in this attempt")
        return opened[-1].wait_id
