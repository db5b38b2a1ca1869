"""A restore names the agent's tools that changed since the restored checkpoint, and applies the job's policy.

Subtask 0's checkpoint marker keeps a digest of every tool's definition
(:mod:`flink_agents_replay.api.tool_definitions`). On restore each change is counted (``tools_changed``) and,
under ``fingerprint_policy`` ``reuse`` or ``re-execute``, logged once with what changed; journaled calls of a
changed tool are reused as they were (they happened), new calls use the tool as it is now. Under ``fail`` the
restore is refused, naming the changes, as a journaled action of other code would be.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from flink_agents_replay.api.tool_definitions import tool_changes
from flink_agents_replay.core.errors import FingerprintMismatchError
from flink_agents_replay.engine.context import FingerprintPolicy
from flink_agents_replay.storage.journal.markers import restored_tools

__all__ = ["check_restored_tools"]

log = logging.getLogger("flink_agents_replay.operator")


def check_restored_tools(values: Iterable[bytes], now: Mapping[str, Mapping[str, str]], *, checkpoint_id: int,
                         policy: FingerprintPolicy, subtask: int) -> list[str]:
    """The changes from the restored markers' tools to ``now`` (none when no marker kept them); raises
    :class:`FingerprintMismatchError` under ``fail`` if there are any."""
    before = restored_tools(values)
    changes = [] if before is None else tool_changes(before, now)
    if not changes:
        return changes
    listed = "; ".join(changes)
    if policy is FingerprintPolicy.FAIL:
        raise FingerprintMismatchError(
            f"the agent's tools changed since checkpoint {checkpoint_id}: {listed}. fingerprint_policy is 'fail': "
            "deploy the tools as they were, or restore with fingerprint_policy 'reuse' (journaled calls are then "
            "reused as they were, new calls use the tools as they are now)")
    if subtask == 0:  # every subtask finds the same: said once
        log.warning("the agent's tools changed since checkpoint %d: %s; journaled calls of these tools are reused as "
                    "they were, new calls use the tools as they are now (fingerprint_policy %r)", checkpoint_id,
                    listed, policy.value)
    return changes
