"""The call gate: where a feature decides, call by call, whether a ``ctx.call`` is made for real.

Before the engine makes a call for real (no journaled result to reuse, nor an in-doubt policy that settled
it) it asks its :class:`CallGate` with a :class:`GatedCall`, and gets one of three answers:

* :class:`Live`: make the call (its call id, ``current_call_id()``, prefixed with ``call_id_prefix``; in a
  replay, with the :class:`~flink_agents_replay.api.call_site.Fork` that tells resources keeping state outside
  the job to read it as of the savepoint and write into the replay's own copy);
* :class:`Recorded`: do not make it; the action gets this record's outcome (its result, or its exception
  raised), journaled as the call's own so that a failover reuses it;
* :class:`Blocked`: do not make it; ``error`` (a ``CallBlocked``) is raised into the action, which may
  handle it, and ``report`` is listed in ``RunResult.blocked``.

A wait (``ctx.wait_for``) with no decision yet asks :meth:`CallGate.decide` with a :class:`GatedWait`: ``None``
(the run waits for a decision from outside), a ``Decision`` to go on with at once (journaled as the wait's
own), or :class:`Blocked` (raised into the action).

Production runs with :data:`ALWAYS_LIVE`. A replay of a changed agent plugs in its side-effect policy
(:class:`flink_agents_replay.replay.gate.ReplayCalls`); the engine knows nothing of replays or captures.
The gate is asked after the ``cancelled`` check and before an external resource's "started" record, so a
call that is not made leaves no trace in the journal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flink_agents_replay.api.call_site import Fork
from flink_agents_replay.api.resources import Resource
from flink_agents_replay.core.errors import CallBlocked
from flink_agents_replay.storage.records.journal import CallRecord
from flink_agents_replay.storage.records.waits import Decision

__all__ = ["ALWAYS_LIVE", "AlwaysLive", "Blocked", "CallGate", "GateDecision", "GatedCall", "GatedWait", "Live",
           "Recorded"]


@dataclass(frozen=True, kw_only=True)
class GatedCall:
    """A call about to be made for real: where it is (input, event, action, position) and what it asks."""

    key: Any
    seq: int
    event_id: str
    action: str
    position: int
    resource_name: str
    resource: Resource
    args_digest: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True, kw_only=True)
class GatedWait:
    """A wait with no decision yet: where it is, its name, the digest of what it asks, and its id."""

    key: Any
    seq: int
    event_id: str
    action: str
    name: str
    args_digest: str
    wait_id: str


@dataclass(frozen=True, kw_only=True)
class Live:
    """Make the call for real; its call id is prefixed with ``call_id_prefix``; ``fork`` goes into its
    :class:`~flink_agents_replay.api.call_site.CallSite`."""

    call_id_prefix: str = ""
    fork: Fork | None = None


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """Do not make the call: give the action ``record``'s outcome (returned or raised)."""

    record: CallRecord


@dataclass(frozen=True, kw_only=True)
class Blocked:
    """Do not make the call: raise ``error`` into the action; ``report`` goes into ``RunResult.blocked``."""

    error: CallBlocked
    report: object


GateDecision = Live | Recorded | Blocked


class CallGate(Protocol):
    """Decides, for each call the engine is about to make for real, whether it is made."""

    def admit(self, call: GatedCall) -> GateDecision:
        """Live, served a recorded outcome, or blocked."""
        ...

    def decide(self, wait: GatedWait) -> Decision | Blocked | None:
        """A decision for the wait now, a block, or ``None``: the run waits for one from outside."""
        ...


class AlwaysLive:
    """The production gate: every call is made for real, every wait waits."""

    _LIVE = Live()

    def admit(self, call: GatedCall) -> GateDecision:
        return self._LIVE

    def decide(self, wait: GatedWait) -> Decision | Blocked | None:
        return None


ALWAYS_LIVE = AlwaysLive()
