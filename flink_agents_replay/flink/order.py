"""Order restoration after a restore (docs/design.md §8): a key's inputs run again in the order the journal recorded.

Inputs of one key coming from several upstream instances may arrive in another interleaving after a
failover than before it. While a key's recovered history is being replayed, its next input is the one the
journal recorded next (found by the input's digest), not the first to arrive; an input that arrives early
waits in the key's ``pending`` state. If the recorded input does not come back within
``order_restore_timeout_s`` (or a bounded input ends), the key's recorded history from there on is dropped
and its waiting inputs run in arrival order.

A recovered history can also expire at a snapshot (``recovered_history_expiry_s``, see
:mod:`flink_agents_replay.storage.journal.checkpoints`), also while its key waits here: the key then keeps waiting
until its own deadline and gives up as above, so an input arriving meanwhile never overtakes the inputs
already waiting.

:class:`OrderRestoration` works on the operator's keyed state (``seq``, ``pending``,
``order_wait_deadline``) and timers, for the key the task thread is at; the recovery index comes from
:class:`~flink_agents_replay.storage.journal.checkpoints.JournalCheckpoints`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flink_agents_replay.engine.digest import digest_value
from flink_agents_replay.storage.formats.state import WaitingInput, decode_waiting
from flink_agents_replay.storage.journal.checkpoints import JournalCheckpoints
from flink_agents_replay.storage.records.journal import RunPosition, key_digest

__all__ = ["DRAIN_TIMER", "OrderRestoration"]

log = logging.getLogger("flink_agents_replay.operator")

#: Event-time timer fired by the final watermark of a bounded input (the end of the input).
DRAIN_TIMER = 2**63 - 2

#: What a key waits for when its recorded history expired during the wait: no input's digest, so nothing
#: matches and the wait ends at its deadline.
EXPIRED_HISTORY = "expired-history"
#: What a key's next input waits for when the journal recorded a parked run resuming first (docs/design.md §16):
#: no input's digest either; the resume ends the wait, or its deadline does.
RESUME_FIRST = "resume-first"


class OrderRestoration:
    """Chooses a key's next waiting input while its recovered history replays; waits (bounded) for a missing one.

    Args:
        seq_state, pending_state, wait_state: the operator's keyed state handles (``seq``, ``pending``,
            ``order_wait_deadline``).
        journal: where the recovery index and the "restore under way" flag are.
        enabled: order restoration on (``restore_input_order`` and a mode that restores order).
        timeout_s: how long a key waits for its recorded next input.
        counters: the operator's counters (``inputs_reordered``, ``order_restore_timeouts``).
        subtask: this subtask's index (for log lines).
    """

    def __init__(self, *, seq_state, pending_state, wait_state, journal: JournalCheckpoints, enabled: bool,
                 timeout_s: float, counters: Mapping[str, Any], subtask: int):
        self.seq_state = seq_state
        self.pending_state = pending_state
        self.wait_state = wait_state
        self.journal = journal
        self.enabled = enabled
        self.timeout_s = timeout_s
        self.counters = counters
        self.subtask = subtask

    def recorded_next_input(self, key) -> str | None:
        """While a restore replays: the digest of the input the journal recorded as ``key``'s next one, or
        ``None`` when any input may run next (nothing recorded there, or order restoration is off)."""
        if not self.enabled:
            return None
        expected = None
        if self.journal.restored:
            history = self.journal.index.history(key_digest(key))
            if history is not None:
                accepted = self.seq_state.value() or 0
                resume_first = history.recorded_resume(accepted) is not None
                expected = RESUME_FIRST if resume_first else history.recorded_input(accepted + 1)
        if expected is None and self.journal.histories_expired and self.wait_state.value() is not None:
            return EXPIRED_HISTORY  # waiting when its history expired: wait on, to the deadline
        return expected

    def recorded_resume(self, key) -> int | None:
        """While a restore replays: the seq of the parked run the journal recorded resuming next, before the key's
        next input (its later inputs ran while it waited), if any."""
        if not (self.enabled and self.journal.restored):
            return None
        history = self.journal.index.history(key_digest(key))
        return history.recorded_resume(self.seq_state.value() or 0) if history is not None else None

    def hold_for_recorded(self, ctx) -> None:
        """A parked run has its decision but the journal recorded an input of the key next: wait for it, bounded
        (when it does not come back, :meth:`give_up` and the run resumes)."""
        self._await_predecessor(ctx)

    def resuming(self) -> None:
        """A parked run of the key resumes now: a wait for it is over."""
        if self.journal.restored:
            self._end_wait()

    def take_next(self, key, waiting: list[bytes], ctx) -> WaitingInput | None:
        """Remove and return the key's next waiting input (``waiting``: the key's ``pending`` state, encoded):
        the one the journal recorded next, else the first to arrive; ``None`` when nothing waits or the
        recorded one has not come back yet (then it waits)."""
        if not waiting:
            return None
        expected = self.recorded_next_input(key)
        chosen = 0 if expected is None else next(
            (i for i, raw in enumerate(waiting) if digest_value(decode_waiting(raw).value) == expected), None)
        if chosen is None:  # its recorded predecessor has not come back yet: wait for it (bounded)
            self._await_predecessor(ctx)
            return None
        if chosen:
            self.counters["inputs_reordered"].inc()
        if self.journal.restored:  # only a restored key can be waiting (its history keeps the index non-empty)
            self._end_wait()
        self.pending_state.update(waiting[:chosen] + waiting[chosen + 1:])
        return decode_waiting(waiting[chosen])

    def wait_over(self, timestamp: int, draining: bool) -> bool:
        """Whether a timer with no run in flight ends the key's wait (its deadline passed, or the input ended)."""
        deadline = self.wait_state.value()
        return deadline is not None and (draining or timestamp >= deadline)

    def give_up(self, key, why: str) -> None:
        """A recorded input never came back: drop the key's recorded history from there (the operator then
        runs what waits, in arrival order)."""
        next_seq = (self.seq_state.value() or 0) + 1
        history = self.journal.index.history(key_digest(key))
        # Below the order of a resume recorded after the last accepted input (2**62): that is dropped too.
        dropped = history.drop_after(RunPosition(next_seq - 1, 2**62 - 1)) if history is not None else 0
        waiting = len(list(self.pending_state.get() or []))
        self.counters["order_restore_timeouts"].inc()
        log.warning("subtask %d key %r: order restore %s after %.1f s waiting for the input recorded at seq %d; "
                    "the key's recorded history from there on is invalidated (%d records) and its %d waiting "
                    "inputs run in arrival order", self.subtask, key, why, self.timeout_s, next_seq, dropped,
                    waiting)
        self.wait_state.clear()
        self.journal.index.forget_if_empty(key_digest(key))

    def _await_predecessor(self, ctx) -> None:
        if self.wait_state.value() is not None:
            return
        deadline = ctx.timer_service().current_processing_time() + int(self.timeout_s * 1000)
        self.wait_state.update(deadline)
        ctx.timer_service().register_processing_time_timer(deadline)
        ctx.timer_service().register_event_time_timer(DRAIN_TIMER)  # a bounded input's end ends the wait too

    def _end_wait(self) -> None:
        # The deadline's timer stays: it fires, finds no wait (wait_over) and goes. Deleting it could delete the
        # key's run check too, were both due in the same millisecond (Flink keeps one timer per key and time).
        self.wait_state.clear()
