"""The ordinary-Python-habit tests (``tests/integration/test_habit_*.py``), each body run on the engine.

Each habit test builds its agent with ``make_agent(counter, fault, name)`` and asserts on what
:func:`~tests.harness.reference_runs.reference_then_faulty_run` returns: a failure-free reference and a run
with an injected crash. Here the very same test function runs with that helper replaced by
:func:`~tests.harness.engine_runs.reference_then_crashing_run`: the run engine with the in-memory journal,
the crash and the restarts in this process, in milliseconds. Every case of every habit runs here; each
habit keeps one case as a real Flink job with Kafka (the integration files' own parametrizations).
"""

from __future__ import annotations

import pytest

from tests.harness.engine_runs import reference_then_crashing_run
from tests.integration import (
    test_habit_dataclass_and_exception_values as dataclass_values,
)
from tests.integration import (
    test_habit_handled_exotic_exceptions as exotic_exceptions,
)
from tests.integration import (
    test_habit_memory_in_place as memory_in_place,
)
from tests.integration import (
    test_habit_retry_loop_after_crash as retry_loop,
)
from tests.integration import (
    test_habit_shared_event_objects as shared_events,
)
from tests.integration import (
    test_habit_sub_agent_duplicate_fanout as duplicate_fanout,
)
from tests.integration import (
    test_habit_tool_mutates_argument as tool_mutates,
)


def on_the_engine(kafka_bootstrap, tmp_path, make_agent, inputs, *, name_prefix: str, checkpoint_interval_ms: int,
                  restart_attempts: int, keep_job_error: bool = False):
    """``reference_then_faulty_run``'s signature, run on the engine (no broker: ``kafka_bootstrap`` is unused;
    every restart is one before a checkpoint, whatever ``checkpoint_interval_ms`` says)."""
    return reference_then_crashing_run(tmp_path, make_agent, inputs, name_prefix=name_prefix,
                                       restart_attempts=restart_attempts, keep_job_error=keep_job_error)


CASES = [
    *[pytest.param(exotic_exceptions, "test_handled_exotic_exceptions_survive_restart_before_checkpoint",
                   {"kind": kind}, id=f"exotic-exception-{kind}") for kind in exotic_exceptions.KINDS],
    # One case: the engine restarts before a checkpoint whatever the interval (the Flink case runs both).
    pytest.param(memory_in_place, "test_in_place_memory_changes_survive_restarts",
                 {"checkpoint_interval_ms": 600_000}, id="memory-in-place"),
    *[pytest.param(retry_loop, "test_retry_loop_then_crash_does_not_repeat_charge",
                   {"fails_before_success": fails}, id=f"retry-loop-{fails}") for fails in (0, 2)],
    pytest.param(retry_loop, "get_or_create_then_crash_does_not_repeat_charge", {}, id="get-or-create"),
    pytest.param(dataclass_values,
                 "test_a_dataclass_tool_parameter_and_a_kw_only_exception_in_memory_survive_a_fail_over", {},
                 id="dataclass-and-exception-values"),
    pytest.param(shared_events, "test_events_shared_between_handlers", {}, id="shared-event-objects"),
    pytest.param(duplicate_fanout, "test_duplicate_fanout_to_sub_agent", {}, id="sub-agent-duplicate-fanout"),
    pytest.param(tool_mutates, "test_tool_that_appends_to_memory_list", {}, id="tool-mutates-argument"),
]


@pytest.mark.parametrize(("module", "test_name", "arguments"), CASES)
def test_habit_on_the_engine(module, test_name, arguments, tmp_path, monkeypatch):
    monkeypatch.setattr(module, "reference_then_faulty_run", on_the_engine)
    getattr(module, test_name)(kafka_bootstrap=None, tmp_path=tmp_path, **arguments)
