"""The agent operator's metrics: their names and what each counts (docs/metrics.md is made from this table).

All live in the operator's metric group ``flink_agents_replay``, per subtask. The values (:data:`VALUES`) are
counters holding a value, not gauges: Flink reads gauges on its metrics thread, and a Python gauge calling into
the embedded interpreter from there crashes a thread-mode TaskManager (seen with PyFlink 2.3).
"""

from __future__ import annotations

__all__ = ["COUNTERS", "GROUP", "VALUES"]

#: The operator's metric group.
GROUP = "flink_agents_replay"

#: Counters: events since the subtask started.
COUNTERS: dict[str, str] = {
    "actions_executed": "actions run (not reused from the journal)",
    "actions_reused": "actions skipped after a restore because their completion was journaled; their memory "
                      "updates and events re-applied",
    "calls_executed": "calls through `ctx.call` made for real",
    "calls_reused": "calls answered from the journal instead of being made again",
    "calls_reused_out_of_order": "reused calls that an action asked for at another place among its calls than "
                                 "when journaled (a set's iteration order, say)",
    "calls_in_doubt": "calls found started and never finished after a restore (their `in_doubt` policy decided)",
    "calls_reconciled": "calls in doubt whose reconciler found them done or failed (its answer journaled as theirs)",
    "calls_reconciled_unknown": "calls in doubt whose reconciler could not tell, after its retries (left in doubt)",
    "tools_changed": "tools of the agent added, removed or changed since the restored checkpoint (logged with how)",
    "divergences": "keys whose recorded history was dropped because a different input came at a recorded seq",
    "fingerprint_mismatches": "journaled completions written by other action code (`fingerprint_policy` decided)",
    "journal_records_pruned": "journal records deleted after completed checkpoints",
    "child_calls_executed": "sub-agent calls run",
    "child_calls_reused": "sub-agent calls answered from the journal",
    "order_restore_timeouts": "keys that stopped waiting for a recorded input after `order_restore_timeout_s`",
    "inputs_reordered": "inputs run out of arrival order to follow the journal's recorded order",
    "calls_recorded": "replay: calls answered from production's recorded calls",
    "calls_blocked": "replay: calls not made (`CallBlocked`)",
    "replay_inputs_skipped": "replay: captured inputs the savepoint already held",
    "replay_capture_records_skipped": "replay: capture records that did not verify, skipped",
    "replay_runs_failed": "replay: runs that failed (reported in the diff, not fatal)",
    "calls_retried_after_failure": "calls made again, under a new call id, because their failure ended the action",
    "runs_abandoned": "runs still calling when the operator closed after `close_timeout_s`; their calls are in doubt",
    "earlier_attempt_records_ignored": "journal records of an earlier attempt (a zombie) ignored at a restore",
    "external_calls_fenced": "external calls not made because a newer attempt of the task had started elsewhere "
                             "(this attempt was a zombie: the fence topic, counted when it closes)",
    "histories_expired": "keys whose recovered history expired after `recovered_history_expiry_s`",
    "runs_woken": "runs applied when their completion woke their key",
    "runs_checked": "runs applied by their key's check timer (polling, or the fallback behind wake-ups)",
    "runs_drained": "runs waited for at the end of a bounded input",
    "waits_opened": "runs that stopped at `ctx.wait_for` and were parked until their decision",
    "waits_timed_out": "waits whose deadline passed with no decision (their run resumed with the timeout)",
    "decisions_applied": "decisions that resumed their waiting run",
    "decisions_early": "decisions for no wait of their key yet, kept for `early_decision_ttl_s`",
    "decisions_ignored": "decisions for a wait that already had one (duplicates)",
    "decisions_unmatched": "early decisions whose wait never came within `early_decision_ttl_s`",
    "decisions_rejected": "decisions that could not be read (reported as `decision_rejected` events)",
    "runs_ended_at_wait": "resumed runs ended by a timeout (`WaitTimedOutError`) or denial (`ToolCallDeniedError`) "
                          "their action did not handle: no output, memory as before (the `closed` event says why)",
    "spans_exported": "tracing: spans the trace collector took",
    "spans_dropped": "tracing: spans lost: the collector did not take them (down, or too slow for the queue)",
}

#: Counters that hold a value instead of counting.
VALUES: dict[str, str] = {
    "last_restore_duration_ms": "how long the last restore took to read the journal, in ms",
    "run_pool_size": "`max_concurrent_runs`: runs that may execute at once in the subtask",
    "child_pool_size": "`max_concurrent_child_calls`: the sub-agent pool's threads",
    "runs_waiting": "runs parked at `ctx.wait_for` now, waiting for their decision or deadline (kept across restores "
                    "in the checkpoint markers)",
}
