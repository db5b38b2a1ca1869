"""The testing API reads the Python exception out of the Java trace a failed PyFlink job raises."""

from flink_agents_replay.testing._environment import python_exception_line

THREAD_MODE = """An error occurred while calling o36.execute.
: org.apache.flink.runtime.client.JobExecutionException: Job execution failed.
Caused by: pemja.core.PythonException: <class 'shop.errors.RefundError'>: refund of 7 over the limit
\tat /work/shop/agent.py.refuse(agent.py:12)
"""

PROCESS_MODE = """Caused by: java.lang.RuntimeException: Error received from SDK harness for instruction 4:
Traceback (most recent call last):
  File "/usr/lib/python3/agent.py", line 12, in refuse
    raise ValueError("no")
ValueError: no: not today
\tat org.apache.beam.runners.fnexecution.control.FnApiControlClient
"""


def test_the_python_exception_is_found_in_either_mode_and_a_trace_without_one_gives_none():
    assert python_exception_line(THREAD_MODE) == "RefundError: refund of 7 over the limit"
    assert python_exception_line(PROCESS_MODE) == "ValueError: no: not today"
    assert python_exception_line("java.lang.OutOfMemoryError: Java heap space") is None


BRIDGE = """An error occurred while calling o23.execute.
: org.apache.flink.runtime.client.JobExecutionException: Job execution failed.
Caused by: java.lang.IllegalStateException: flink-agents-replay: no queued input could start within 1000 ms \
(slot_wait_timeout_s): a call may hang
\tat io.github.flinkagentsreplay.bridge.CompletionWakeups.awaitInputRelease(CompletionWakeups.java:118)
"""


def test_an_error_of_the_checkpoint_bridge_is_found_when_no_python_exception_ended_the_job():
    """Found by an adversarial user: the timeout read 'An error occurred while calling o23.execute.'"""
    assert python_exception_line(BRIDGE) == ("IllegalStateException: flink-agents-replay: no queued input could "
                                             "start within 1000 ms (slot_wait_timeout_s): a call may hang")
    assert python_exception_line(THREAD_MODE + BRIDGE) == "RefundError: refund of 7 over the limit"
