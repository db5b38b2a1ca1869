"""When an exception leaves an action: which of its failed calls the next attempt makes again.

A call that raised is normally reused like one that returned: the action saw the exception and may have
handled it, and making the call again could move its path. But when an exception *leaves* the action, the
engine journals, acknowledged, an "action failed" record naming the calls to retry
(:func:`calls_to_retry`): those of the action's last steps, back to the last step in which a call
returned. The next attempt makes exactly those again, under a new call id. A crash (the operator closing,
a killed process) is not a failure of the action: nothing is journaled for it, and what the action had
journaled is reused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from flink_agents_replay.api.agent import ActionSpec
from flink_agents_replay.engine.context import RunCancelled, RunJournal
from flink_agents_replay.storage.records.journal import ActionFailedRecord, RecordKind

__all__ = ["CallStep", "calls_to_retry", "is_crash", "journal_action_failed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallStep:
    """One ``ctx.call`` (one position) or ``ctx.call_agents`` (one position per child) and how its calls ended."""

    raised: tuple[int, ...] = ()
    returned: tuple[int, ...] = ()


def calls_to_retry(steps: list[CallStep]) -> list[int]:
    """The failed calls the next attempt makes again, after an exception left the action.

    Those of the action's last steps, back to the last step that had a call return: making them again can
    change the action's path only after every call that succeeded, so no journaled success is ever out of
    place (and repeated). A failure the action handled and got past (a retry loop that then succeeded, a
    get-or-create) is reused as it was; a retry loop that gave up is made again; in a fan-out every failed
    child is run again at once.
    """
    positions: list[int] = []
    for step in reversed(steps):
        positions += step.raised
        if step.returned:
            break
    return sorted(positions)


def is_crash(error: BaseException | None) -> bool:
    """An error that ends the attempt rather than being the call's outcome: the operator closing, or a
    non-``Exception`` (``SystemExit``, ``KeyboardInterrupt``, a test's simulated crash)."""
    return error is not None and (isinstance(error, RunCancelled) or not isinstance(error, Exception))


def journal_action_failed(journal: RunJournal, record_key: bytes, spec: ActionSpec,
                          record: ActionFailedRecord) -> None:
    """Journal, acknowledged, that an exception left the action: the next attempt makes its failed calls again.

    If the journal cannot take it, the action's exception still fails the task (it says what went wrong).
    """
    try:
        journal.write(record_key, RecordKind.ACTION_FAILED, record, fingerprint=spec.fingerprint, must_ack=True,
                      what=f"the failure of action {record.action}")
    except Exception as error:  # noqa: BLE001 - never hide the action's own exception
        log.warning("seq %d action %s: could not journal its failure (%s); its failed calls may be reused",
                    record.seq, record.action, error)
