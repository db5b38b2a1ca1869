"""Which subtask a Python function runs in, in either PyFlink execution mode.

PyFlink 2.3's thread-mode runtime context still calls the Flink 1.x ``RuntimeContext`` getters
(``getIndexOfThisSubtask`` ...) that Flink 2 moved to ``getTaskInfo()``, so
``get_index_of_this_subtask()`` and its siblings raise ``AttributeError`` there. This module asks the
Java context's ``TaskInfo`` directly when that happens; it is the one place that knows about the bug.
The job id, which no Python getter offers, comes from the Java context's ``JobInfo`` (``None`` where there
is no Java context).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SubtaskInfo", "subtask_info"]


@dataclass(frozen=True)
class SubtaskInfo:
    """Position of one parallel instance: ``index`` of ``parallelism``, at most ``max_parallelism``."""

    index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    job_id: str | None = None


def subtask_info(runtime_context) -> SubtaskInfo:
    """Return the :class:`SubtaskInfo` of the function that received ``runtime_context`` in ``open``."""
    try:
        return SubtaskInfo(
            index=runtime_context.get_index_of_this_subtask(),
            parallelism=runtime_context.get_number_of_parallel_subtasks(),
            max_parallelism=runtime_context.get_max_number_of_parallel_subtasks(),
            attempt=runtime_context.get_attempt_number(),
            job_id=_job_id(getattr(runtime_context, "_runtime_context", None)),
        )
    except AttributeError:
        java_context = getattr(runtime_context, "_runtime_context", None)
        if java_context is None:
            raise
        task_info = java_context.getTaskInfo()
        return SubtaskInfo(
            index=task_info.getIndexOfThisSubtask(),
            parallelism=task_info.getNumberOfParallelSubtasks(),
            max_parallelism=task_info.getMaxNumberOfParallelSubtasks(),
            attempt=task_info.getAttemptNumber(),
            job_id=_job_id(java_context),
        )


def _job_id(java_context) -> str | None:
    """Flink's job id (hex), the same for every attempt of a job."""
    get_job_info = getattr(java_context, "getJobInfo", None)
    return None if get_job_info is None else str(get_job_info().getJobId().toString())
