"""A replay's call gate: the side-effect policy (:mod:`.policy`) applied to every ``ctx.call`` of a run.

The engine asks its :class:`~flink_agents_replay.engine.gate.CallGate` before it makes a call for real.
:class:`ReplayCalls` answers for one run of a replay: ``live`` makes the call (with a call id of the
replay's own), ``recorded`` serves production's call that asked the same (same input, event, action,
resource and arguments' digest; a call that only started is no result), each production call once and in any
order, as the run engine matches journaled calls (:mod:`flink_agents_replay.engine.calls`), and ``blocked`` — or
``recorded`` without such a call — raises :class:`~flink_agents_replay.core.errors.CallBlocked` into the action
and reports the call (:class:`~flink_agents_replay.storage.capture.records.BlockedCall`) for the diff.

A wait (``ctx.wait_for``) with no decision yet gets one by the wait policy (:meth:`ReplayCalls.decide`). Under
``recorded``, a wait production recorded no decision for stays open when production never finished the run of
the same input (it was still waiting when the capture ended): the gate answers ``None``, and the replay's run
parks as production's did, reported as still waiting in the diff. When production finished that run, its new
wait (the changed code asks another question) is blocked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flink_agents_replay.api.call_site import Fork
from flink_agents_replay.core.errors import CallBlocked
from flink_agents_replay.engine.calls import JournaledCalls
from flink_agents_replay.engine.gate import Blocked, GatedCall, GateDecision, GatedWait, Live, Recorded
from flink_agents_replay.replay.policy import CallPolicy, WaitPolicy, policy_for
from flink_agents_replay.storage.capture.records import BlockedCall
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, Decision

__all__ = ["ReplayCalls", "describe_arguments"]


@dataclass(frozen=True)
class ReplayCalls:
    """How a replay treats one run's calls: the policy per resource name (``*``: any other) and the calls
    production made in the run of the same input, by (event id, action, position)."""

    policies: dict[str, CallPolicy]
    recorded: dict[tuple[str, str, int], CallRecord] = field(default_factory=dict)
    #: Prefix of the replay's call ids: a live call must not be answered from a service's idempotency store
    #: with what production's call with the same id got.
    call_id_prefix: str = "replay:"
    #: What live calls tell resources that keep state outside the job (long-term memory): read production's
    #: state as of the savepoint, write into the replay's own overlay.
    fork: Fork | None = None
    wait_policy: WaitPolicy = WaitPolicy.RECORDED
    #: Whether production's capture holds the finished run of this input. Without it (production was still
    #: waiting when the capture ended, or had not run it), a wait with no recorded decision stays open.
    production_finished: bool = True
    _unserved: dict[tuple[str, str], JournaledCalls] = field(default_factory=dict, init=False, repr=False)

    def admit(self, call: GatedCall) -> GateDecision:
        """Live, production's recorded outcome, or blocked (with the reason in the ``CallBlocked``)."""
        policy = policy_for(call.resource_name, call.resource, self.policies)
        if policy is CallPolicy.LIVE:
            return Live(call_id_prefix=self.call_id_prefix, fork=self.fork)
        if policy is CallPolicy.RECORDED:
            production = self._production_call(call)
            if production is not None and production.outcome is not CallOutcome.STARTED:
                return Recorded(record=production)
        arguments = describe_arguments(call.args, call.kwargs)
        why = "its policy is 'blocked'" if policy is CallPolicy.BLOCKED else "production made no such call"
        error = CallBlocked(f"replay: call {call.position} to {call.resource_name!r} in action {call.action} (key "
                            f"{call.key!r} seq {call.seq}) was not made: {why}; arguments {arguments}",
                            call.resource_name, arguments)
        report = BlockedCall(call.event_id, call.action, call.position, call.resource_name, arguments)
        return Blocked(error=error, report=report)

    def decide(self, wait: GatedWait) -> Decision | Blocked | None:
        """The wait's decision by the wait policy: production's for the same question, or approve or deny all.
        A wait production recorded no decision for stays open (``None``: the run parks) if production never finished
        the run either, and is blocked if it did: a replay does not wait for people."""
        if self.wait_policy is WaitPolicy.APPROVE:
            return Decision.approve("the replay's wait policy approves every wait", by="replay")
        if self.wait_policy is WaitPolicy.DENY:
            return Decision.deny("the replay's wait policy denies every wait", by="replay")
        production = self._production_call(GatedWaitCall(wait))
        if production is not None and production.outcome is CallOutcome.RETURNED:
            return production.result
        if not self.production_finished:
            return None  # production was still waiting (or never got here): so is the replay, to the diff
        error = CallBlocked(f"replay: wait {wait.name!r} in action {wait.action} (key {wait.key!r} seq {wait.seq}) got "
                            "no decision: production recorded none for it in its finished run of this input (the "
                            "code asks another question); give the replay a wait policy to decide it",
                            DECISION_RESOURCE, wait.name)
        return Blocked(error=error, report=BlockedCall(wait.event_id, wait.action, -1, DECISION_RESOURCE,
                                                       f"wait {wait.name!r} ({wait.wait_id})"))

    def _production_call(self, call: GatedCall | GatedWaitCall) -> CallRecord | None:
        """Production's first call not served yet that asked what ``call`` asks, in the same event and action."""
        if not self._unserved:
            by_action: dict[tuple[str, str], list[CallRecord]] = defaultdict(list)
            for (event_id, action, _), record in self.recorded.items():
                by_action[(event_id, action)].append(record)
            self._unserved.update({slot: JournaledCalls(records) for slot, records in by_action.items()})
        unserved = self._unserved.get((call.event_id, call.action))
        return None if unserved is None else unserved.take(call.resource_name, call.args_digest)


@dataclass(frozen=True)
class GatedWaitCall:
    """A wait's decision as the call production journaled it (resource ``@decision``)."""

    wait: GatedWait
    resource_name: str = DECISION_RESOURCE

    @property
    def event_id(self) -> str:
        return self.wait.event_id

    @property
    def action(self) -> str:
        return self.wait.action

    @property
    def args_digest(self) -> str:
        return self.wait.args_digest


def describe_arguments(args: tuple, kwargs: dict, limit: int = 500) -> str:
    """The arguments of a call as people read them in a report (shortened)."""
    shown = ", ".join([*(repr(a) for a in args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."
