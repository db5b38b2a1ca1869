"""The chaos soak (``bench/chaos_soak.py``) until every fault kind has hit once: random, seeded infrastructure
faults, 0 violations.

The soak starts its own broker (it pauses and restarts it) and its own two-TaskManager cluster, so it uses
none of the suite's fixtures. It injects at least one fault of each kind — an exception in an action, SIGKILL
of a TaskManager, SIGSTOP of a TaskManager until the job runs elsewhere and SIGCONT (a zombie), broker
SIGSTOP/SIGCONT, broker restart, stop-with-savepoint and restore at the other
parallelism — and then checks, on what it recorded outside Flink: every input answered exactly once
(read_committed), replies and final memory equal to a failure-free run, each logical ledger call executed
once and no model request executed twice, the journal bounded. It also proves the faults hit (see
``_fault_shortfalls`` there): the exception was raised, the processes were killed / stopped / replaced, the
restored job runs at the other parallelism, the zombie delivered records after the new attempt's fences, and
calls were under way at kills and pauses.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SOAK = Path(__file__).resolve().parents[2] / "bench" / "chaos_soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("chaos_soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_chaos_soak_every_fault_kind_no_violation():
    soak = _soak_module()
    # Ends as soon as every kind has hit (minutes=0), within 8 minutes. A paused TaskManager is declared lost
    # after 10 s, not the template's 30 s: the zombie is what is tested, not how long Flink takes to notice it.
    # The broker pauses for 4-8 s: an outage that outlasts the clients' timeouts is test_broker_faults.py's, where
    # they are shortened to match (an 18 s pause here took 35 s more to recover from, in CI's minutes).
    result = soak.run_soak(minutes=0, max_minutes=8, seed=13, gap_s=(2.0, 4.0), broker_pause_s=(4.0, 8.0),
                           min_faults=1, heartbeat_timeout_ms=10_000)
    report = soak.format_report(result)
    print("\n" + report)

    hits = result.fault_counts()
    assert all(hits[kind] >= 1 for kind in soak.FAULT_KINDS), report
    assert result.fault_shortfalls == [], report
    assert result.violations == [], report
    assert result.replies == result.tickets_fed > 0, report
