"""Subtask position in both PyFlink modes, including thread mode's broken getters."""

import pytest

from flink_agents_replay.flink.runtime_info import SubtaskInfo, subtask_info


class _ProcessModeContext:
    def get_index_of_this_subtask(self):
        return 2

    def get_number_of_parallel_subtasks(self):
        return 4

    def get_max_number_of_parallel_subtasks(self):
        return 128

    def get_attempt_number(self):
        return 1


class _JavaTaskInfo:
    def getIndexOfThisSubtask(self):  # noqa: N802 - Java names
        return 3

    def getNumberOfParallelSubtasks(self):  # noqa: N802
        return 5

    def getMaxNumberOfParallelSubtasks(self):  # noqa: N802
        return 300

    def getAttemptNumber(self):  # noqa: N802
        return 0


class _JavaJobId:
    def toString(self):  # noqa: N802
        return "d41d8cd98f00b204e9800998ecf8427e"


class _JavaJobInfo:
    def getJobId(self):  # noqa: N802
        return _JavaJobId()


class _JavaContext:
    def getTaskInfo(self):  # noqa: N802
        return _JavaTaskInfo()

    def getJobInfo(self):  # noqa: N802
        return _JavaJobInfo()


class _ThreadModeContext:
    """Like PyFlink 2.3's embedded context: the getters call Java methods Flink 2 removed."""

    _runtime_context = _JavaContext()

    def get_index_of_this_subtask(self):
        raise AttributeError("getIndexOfThisSubtask")


def test_process_mode_getters_are_used():
    assert subtask_info(_ProcessModeContext()) == SubtaskInfo(2, 4, 128, 1)


def test_thread_mode_falls_back_to_task_info():
    assert subtask_info(_ThreadModeContext()) == SubtaskInfo(3, 5, 300, 0, "d41d8cd98f00b204e9800998ecf8427e")


def test_unrelated_attribute_errors_are_not_hidden():
    class Broken:
        def get_index_of_this_subtask(self):
            raise AttributeError("something else")

    with pytest.raises(AttributeError):
        subtask_info(Broken())
