"""The side-effect policy of a replay: what ``ctx.call`` does with each resource.

* ``live``: call for real (the new model or prompt under test, a lookup that changes nothing).
* ``recorded``: return what the call returned in production (a captured call of the same input, event and
  action that asked the same: resource and arguments, in any order, each once); if production made no such
  call, the call is blocked.
* ``blocked``: do not call; the call is listed in the replay report with its arguments and raises
  :class:`~flink_agents_replay.core.errors.CallBlocked`, which the action may handle.

Waits (``ctx.wait_for``) follow the replay's :class:`WaitPolicy`: ``recorded`` (the default) gives a wait the
decision production's run of the same input got for the same question; when production recorded none, the wait
stays open if production never finished that run either (the replay's run parks, and the diff reports it still
waiting), and is blocked if it did; ``approve`` and ``deny`` decide every wait so.

Defaults follow the resource's declared side effects: ``none`` and ``idempotent`` are ``live``,
``external`` is ``blocked``. A resource may carry a default of its own (``replay_default``): MCP tools are
``blocked`` whatever their annotations say, since a "read-only" tool of a production server must not act from a
replay unless the user says so, and the user says so by naming the tool: ``*`` does not reach them. Calls an action
makes outside ``ctx.call`` are not contained by any of this.

:class:`~flink_agents_replay.replay.gate.ReplayCalls` applies these policies to a run's calls: it is the call
gate (:mod:`flink_agents_replay.engine.gate`) the operator gives the run engine in a replay.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from flink_agents_replay.api.resources import Resource, SideEffects
from flink_agents_replay.core.errors import ConfigError

__all__ = ["CallPolicy", "WaitPolicy", "default_policy", "parse_policies", "policy_for"]


class CallPolicy(str, enum.Enum):
    """What a replay does with a call through ``ctx.call``."""

    LIVE = "live"
    RECORDED = "recorded"
    BLOCKED = "blocked"


class WaitPolicy(str, enum.Enum):
    """What a replay decides for a run waiting at ``ctx.wait_for``."""

    RECORDED = "recorded"  # production's recorded decision for the same wait; without one, open or blocked
    APPROVE = "approve"  # approve every wait
    DENY = "deny"  # deny every wait


_DEFAULTS = {SideEffects.NONE: CallPolicy.LIVE, SideEffects.IDEMPOTENT: CallPolicy.LIVE,
             SideEffects.EXTERNAL: CallPolicy.BLOCKED}


def default_policy(resource: Resource) -> CallPolicy:
    """The policy of a resource no setting names: its own ``replay_default``, else from its declared side effects."""
    own = getattr(resource, "replay_default", None)
    return CallPolicy(own) if own is not None else _DEFAULTS[resource.side_effects]


def policy_for(name: str, resource: Resource, settings: Mapping[str, CallPolicy]) -> CallPolicy:
    """The policy of resource ``name``: the setting for it, else ``*``'s (not for a resource with a
    ``replay_default`` of its own: only its name sets it), else the default."""
    chosen = settings.get(name)
    if chosen is None and getattr(resource, "replay_default", None) is None:
        chosen = settings.get("*")
    return default_policy(resource) if chosen is None else chosen


def parse_policies(settings: Mapping[str, str | CallPolicy] | str | None) -> dict[str, CallPolicy]:
    """``{"llm": "recorded"}`` or ``"llm=recorded,orders=live"`` (``*`` for every other resource), validated."""
    if settings is None:
        return {}
    if isinstance(settings, str):
        pairs = [item.split("=", 1) for item in settings.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ConfigError(f"side-effect policies are written name=policy[,name=policy...], got {settings!r}")
        settings = {name.strip(): value.strip() for name, value in pairs}
    parsed = {}
    for name, value in settings.items():
        try:
            parsed[name] = CallPolicy(value)
        except ValueError:
            raise ConfigError(f"side-effect policy of {name!r} must be one of {[p.value for p in CallPolicy]}, "
                              f"got {value!r}") from None
    return parsed
