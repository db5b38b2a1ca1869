"""The demo: a support-ticket agent on a real Flink cluster loses its TaskManager mid-stream, and nothing repeats.

``flink-agents-replay demo`` (what ``./run demo`` runs) does, on this machine and offline:

1. starts a Kafka broker (KRaft, 127.0.0.1), the local OpenAI-compatible model and order service (every
   request counted), a small MCP server of orders (the ``mcp`` SDK's FastMCP over streamable HTTP, recording every
   request in SQLite: the agent's tool loop looks orders up with its ``lookup_order`` tool), a Chroma server for
   the agent's long-term memory (it remembers each customer's past issues and mentions them in its replies), Arize
   Phoenix as the trace viewer (unless ``--trace-viewer-url`` names a running one) and a standalone Flink session
   cluster with two TaskManagers;
2. submits the packaged main job, :mod:`flink_agents_replay.jobs.agent_job`, with ``flink run -d -pym`` and
   Flink's Kafka connector as ``--jarfile`` (tickets topic -> triage agent -> replies topic through Flink's
   exactly-once ``KafkaSink``; ``--orders-mcp-url``: the job lists the MCP server's tools when it is built);
3. feeds a few hundred tickets, and once a checkpoint has completed and part of them are answered, kills
   the TaskManager running the agent with SIGKILL — with model calls in flight and refunds waiting for
   approval. The agent refunds refund tickets; a refund above 150 waits for a person's decision (the run
   parked in Flink state, no thread held). The demo plays the people: it reads the job's wait events and
   approves, denies, answers twice (a duplicate) or too late (after the 15 s timeout declined it);
4. lets Flink restore the last checkpoint on the other TaskManager: the inputs since that checkpoint run
   again, and their actions find their journal records instead of calling the model again;
5. reads the replies topic with ``isolation.level=read_committed`` and prints what happened: calls made,
   calls repeated (expected 0), replies written exactly once, memories stored once per ticket, approvals
   asked and decided, refunds paid (each once), journal records pruned, recovery time, and where to see the runs'
   traces: Phoenix's page of the agent's project and the trace of a run the kill cut short (its calls made before
   the kill shown once as executed, and again as reused after the restore).

Every figure comes from a counter kept outside the operator's log: the model and order service's request
statistics (``GET /stats``), the MCP server's SQLite record of the order lookups, the agent operator's Flink
metrics read over the cluster's REST API (``actions_reused``, ``last_restore_duration_ms``), the journal topic's
watermarks and the replies topic.

Everything it started is stopped, and its temporary directory removed, also on failure or Ctrl-C.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from flink_agents_replay.examples.support_triage import make_tickets, produce_tickets
from flink_agents_replay.flink.config import default_journal_topic, default_uid
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER
from flink_agents_replay.storage.journal.inspect import summarize_topic
from flink_agents_replay.testing.committed import CommittedReader, poll_until

__all__ = ["DEFAULT_JOB_MODULE", "DemoResult", "format_table", "run_demo"]

AGENT_ID = "support-triage"
_INPUT_TOPIC, _OUTPUT_TOPIC = "tickets", "replies"
_DECISIONS_TOPIC, _WAITS_TOPIC = "decisions", "waits"
#: Refunds above this wait for a person; unanswered, they are declined after the timeout.
REFUND_APPROVAL_ABOVE, APPROVAL_TIMEOUT_S = 150.0, 15.0
_METRIC_GROUP = "flink_agents_replay"


#: The job the demo submits: the package's own main job, so an installed wheel runs it.
DEFAULT_JOB_MODULE = "flink_agents_replay.jobs.agent_job"


@dataclass
class DemoResult:
    """What the demo measured."""

    tickets: int
    chat_calls: int
    order_calls: int
    expected_chat_calls: int
    expected_order_calls: int
    repeated_calls: int
    idempotent_replays: int
    replies: int
    missing: int
    duplicates: int
    embedding_calls: int
    memories: int
    duplicate_memories: int
    replies_using_memory: int
    killed: str
    answered_at_kill: int
    calls_in_flight_at_kill: int
    recovery_s: float
    restore_read_s: float
    records_read_at_restore: int
    actions_reused: int
    journal_written: int
    journal_pruned: int
    seconds: float
    order_lookups_resent: int = 0  # lookups made again under the call id they had (in doubt at the kill)
    approvals: Approvals = field(default_factory=lambda: Approvals())
    notes: list[str] = field(default_factory=list)
    runs_traced: int = 0  # run spans (one per run's trace) the trace viewer holds
    viewer_url: str = ""
    recovered_trace_url: str = ""  # a run with calls reused after the kill, in the trace viewer

    @property
    def ok(self) -> bool:
        """Nothing repeated, nothing missing, nothing twice, every call made, every approval decided once."""
        return (self.repeated_calls == 0 and self.missing == 0 and self.duplicates == 0
                and self.replies == self.tickets and self.chat_calls == self.expected_chat_calls
                and self.order_calls == self.expected_order_calls and self.embedding_calls == 2 * self.tickets
                and self.memories == self.tickets and self.duplicate_memories == 0 and self.approvals.ok)


@dataclass
class Approvals:
    """The refunds that waited for a person: what the demo decided, and what the job did with it."""

    asked: int = 0  # waits opened (wait events)
    approved: int = 0  # waits resumed with an approval
    denied: int = 0
    timed_out: int = 0
    resumed_twice: int = 0  # waits resumed more than once (expected 0)
    sent: int = 0  # decisions sent, all of them
    duplicates_sent: int = 0  # of which sent a second time
    late_sent: int = 0  # of which sent after their wait's timeout on purpose
    ignored: int = 0  # decisions the job reported ignored: each sent one not applied (a duplicate, or too late)
    refunds_paid: int = 0  # refunds the order service executed
    replies_refunded: int = 0  # replies that say the refund was paid

    @property
    def ok(self) -> bool:
        return (self.asked == self.approved + self.denied + self.timed_out and self.resumed_twice == 0
                and self.sent == self.approved + self.denied + self.ignored  # each decision applied or ignored
                and self.ignored >= self.duplicates_sent + self.late_sent
                and self.refunds_paid == self.replies_refunded)


def format_table(result: DemoResult) -> str:
    """The result as a table for people."""
    rows = [
        ("tickets fed", f"{result.tickets}"),
        ("model calls made", f"{result.chat_calls} (expected {result.expected_chat_calls}: 2 per ticket, "
                             "3 with an order to look up)"),
        ("tool calls made", f"{result.order_calls} order lookups by the MCP server (expected "
                            f"{result.expected_order_calls}: one per ticket naming an order)"),
        ("memory calls made", f"{result.embedding_calls} embedding requests (expected {2 * result.tickets}: a "
                              "search and a write per ticket)"),
        ("TaskManager killed", f"{result.killed} with SIGKILL, about {result.answered_at_kill} tickets answered, "
                               f"{result.calls_in_flight_at_kill} model calls in flight"),
        ("recovery time", f"{result.recovery_s:.1f} s from the kill to the job running again"),
        ("journal read at restore", f"{result.records_read_at_restore} records (unpruned at the kill) in "
                                    f"{result.restore_read_s:.2f} s"),
        ("actions reused", f"{result.actions_reused} (journaled before the kill, not run again)"),
        ("calls repeated", f"{result.repeated_calls} (the same request executed twice by the model or tool)"),
        ("calls in doubt re-sent", f"{result.idempotent_replays} (their results had not reached the journal; "
                                   "answered once, by idempotency key); "
                                   f"{result.order_lookups_resent} order lookups asked again under their call id "
                                   "(read-only: counted once)"),
        ("replies written", f"{result.replies} (read_committed), missing {result.missing}, "
                            f"duplicates {result.duplicates}"),
        ("long-term memory", f"{result.memories} memories for {result.tickets} tickets, duplicates "
                             f"{result.duplicate_memories}; {result.replies_using_memory} replies mention the "
                             "customer's past issues"),
        ("approvals asked", f"{result.approvals.asked} refunds above {REFUND_APPROVAL_ABOVE:g} waited for a person "
                            "(no thread held; parked across the kill)"),
        ("decisions", f"{result.approvals.approved} approved, {result.approvals.denied} denied, "
                      f"{result.approvals.timed_out} timed out after {APPROVAL_TIMEOUT_S:g} s (declined); "
                      f"{result.approvals.resumed_twice} runs resumed twice"),
        ("odd decisions", f"{result.approvals.ignored} of {result.approvals.sent} sent ignored: "
                          f"{result.approvals.duplicates_sent} duplicates, {result.approvals.late_sent} sent after the "
                          "timeout on purpose, "
                          f"{result.approvals.ignored - result.approvals.duplicates_sent - result.approvals.late_sent} "
                          "that came after their wait timed out"),
        ("refunds paid", f"{result.approvals.refunds_paid} by the order service, for "
                         f"{result.approvals.replies_refunded} replies saying so (each once)"),
        ("journal records", f"{result.journal_written} written, {result.journal_pruned} pruned at checkpoints"),
        ("traces", f"{result.runs_traced} runs, one trace each, in Phoenix: {result.viewer_url}"),
        ("a recovered run", result.recovered_trace_url or "none found (no run reused calls after the kill)"),
        ("demo took", f"{result.seconds:.0f} s"),
        ("verdict", "OK: every effect once" if result.ok else "FAILED"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join([*lines, *(f"note: {note}" for note in result.notes)])


class _Progress:
    """Timestamped progress lines."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.begun = time.monotonic()

    def __call__(self, message: str) -> None:
        self.say(f"[{time.monotonic() - self.begun:6.1f} s] {message}")


def run_demo(*, tickets: int = 300, customers: int = 40, parallelism: int = 2, model_delay_ms: int = 40,
             feed_per_second: float = 25.0, kill_after: float = 0.35, job_module: str = DEFAULT_JOB_MODULE,
             trace_viewer_url: str | None = None, say: Callable[[str], None] = print) -> DemoResult:
    """Run the demo end to end; return what it measured. See the module docstring.

    Args:
        tickets: tickets to feed.
        customers: distinct customers (the key) among them.
        parallelism: parallelism of the agent.
        model_delay_ms: how long each model and order request takes.
        feed_per_second: tickets written to the input topic per second.
        kill_after: fraction of the tickets answered before the TaskManager is killed.
        job_module: the job to submit, a module taking the main job's arguments (default the packaged main job).
        trace_viewer_url: a running Phoenix to send the traces to (default: the demo starts one, and stops it).
        say: where progress lines go.
    """
    demo = _Demo(_Progress(say), tickets=make_tickets(tickets, customers), model_delay_ms=model_delay_ms,
                 trace_viewer_url=trace_viewer_url)
    try:
        demo.start_services()
        demo.submit(job_module, parallelism, feed_per_second)
        kill = demo.kill_midstream(max(1, int(tickets * kill_after)))
        recovery_s = demo.await_recovery(kill.at)
        result = demo.finish(kill, recovery_s)
        demo.failed = not result.ok
        return result
    finally:
        demo.stop()


@dataclass
class _Kill:
    """The TaskManager the demo killed, and the moment."""

    victim: str
    at: float
    answered: int
    in_flight: int
    journal_records: int


class _Demo:
    """The demo's services and phases: start, submit and feed, kill, wait for recovery, measure, stop."""

    def __init__(self, progress: _Progress, *, tickets: list[dict], model_delay_ms: int,
                 trace_viewer_url: str | None = None):
        from flink_agents_replay.flink.operator import LOG_FILE_ENV
        from flink_agents_replay.local.chroma_server import LocalChromaServer
        from flink_agents_replay.local.flink_cluster import LocalFlinkCluster
        from flink_agents_replay.local.kafka_broker import LocalKafkaBroker
        from flink_agents_replay.local.mcp_orders_server import LocalMcpOrdersServer
        from flink_agents_replay.local.model_server import StubModelServer
        from flink_agents_replay.local.phoenix_server import LocalPhoenixServer

        self.progress = progress
        self.tickets = tickets
        self.work = Path(tempfile.mkdtemp(prefix="far-demo-"))
        # The cluster's processes inherit this: the operator's log lines land in a file kept with the logs when the
        # demo fails (for diagnosis only: the figures come from counters, see _agent_metrics).
        self._log_env = LOG_FILE_ENV
        self._previous_log_file = os.environ.get(LOG_FILE_ENV)
        os.environ[LOG_FILE_ENV] = str(self.work / "operator.log")
        self.broker = LocalKafkaBroker(self.work / "kafka", port=0)
        self.server = StubModelServer(port=0, delay_ms=model_delay_ms)
        # Order lookups take as long as the model's requests (the delay after the lookup, as a slow answer).
        self.mcp = LocalMcpOrdersServer(self.work / "mcp", port=0, delay_s=model_delay_ms / 1000)
        self.mcp_url = ""
        self.chroma = LocalChromaServer(self.work / "chroma", port=0, start_timeout_s=300)
        self.chroma_url = ""
        self.cluster = LocalFlinkCluster(self.work / "flink", taskmanagers=2)
        # The trace viewer (installed into the cache on first use) starts beside the other services.
        self.viewer = None if trace_viewer_url else LocalPhoenixServer(port=0, work_dir=self.work / "phoenix",
                                                                       start_timeout_s=600)
        self.viewer_url = trace_viewer_url or ""
        self._viewer_start: _Background | None = None
        self.feeder: _Feeder | None = None
        self.approver: _Approver | None = None
        self.reader: CommittedReader | None = None
        self.failed = True
        self.bootstrap = self.job_id = ""
        self.journal_topic = default_journal_topic(default_uid(AGENT_ID))

    def start_services(self) -> None:
        """Kafka, the model and order service, the MCP orders server, a Flink session cluster; the input and output
        topics."""
        if self.viewer is not None:
            self.progress("starting Phoenix, the trace viewer, meanwhile (installed into the cache on first use: two "
                          "minutes or so)")
            self._viewer_start = _Background(self.viewer.start)
        self.progress("starting Kafka (KRaft) on 127.0.0.1")
        self.bootstrap = self.broker.start().bootstrap_servers
        self.server.start()
        self.progress(f"Kafka at {self.bootstrap}; model and order service at {self.server.base_url}")
        self.mcp_url = self.mcp.start()
        self.progress(f"MCP orders server (lookup_order, the agent's order lookups) at {self.mcp_url}")
        self.progress("starting Chroma for long-term memory (installed into the cache on first use: a minute or two)")
        self.chroma_url = self.chroma.start().url
        self.progress(f"Chroma at {self.chroma_url}")
        self.progress("starting a Flink session cluster: 1 JobManager, 2 TaskManagers")
        self.cluster.start()
        self.progress(f"Flink web UI at {self.cluster.rest_url}")
        if self._viewer_start is not None:
            self.viewer_url = self._viewer_start.result().url
        self.progress(f"traces go to Phoenix at {self.viewer_url}")
        ensure_topics(self.bootstrap, [_INPUT_TOPIC, _OUTPUT_TOPIC, _DECISIONS_TOPIC], partitions=2,
                      replication_factor=1)

    def submit(self, job_module: str, parallelism: int, feed_per_second: float) -> None:
        """Submit the agent job with ``flink run -d -pym`` and start feeding tickets."""
        from flink_agents_replay.local.jars import kafka_connector_jar

        self.progress(f"submitting {job_module} with `flink run -d -pym` (parallelism {parallelism})")
        self.job_id = self.cluster.submit_python_module(
            job_module, "--bootstrap-servers", self.bootstrap, "--input-topic", _INPUT_TOPIC,
            "--output-topic", _OUTPUT_TOPIC, "--agent-id", AGENT_ID, "--parallelism", str(parallelism),
            "--model-base-url", self.server.base_url, "--orders-mcp-url", self.mcp_url,
            "--signing-key", secrets.token_hex(16),
            "--checkpoint-interval-ms", "2000", "--memory-url", self.chroma_url, "--signals-topic", _DECISIONS_TOPIC,
            "--waits-topic", _WAITS_TOPIC, "--refund-approval-above", str(REFUND_APPROVAL_ABOVE),
            "--approval-timeout-s", str(APPROVAL_TIMEOUT_S), "--otlp-endpoint", self.viewer_url,
            jar=kafka_connector_jar(),
        )
        self.progress(f"job {self.job_id} submitted; feeding {len(self.tickets)} tickets at {feed_per_second:.0f}/s")
        self.feeder = _Feeder(self.bootstrap, _INPUT_TOPIC, self.tickets, feed_per_second)
        self.feeder.start()
        self.reader = CommittedReader(self.bootstrap, _OUTPUT_TOPIC, decode=json.loads)
        self.approver = _Approver(self.bootstrap)
        self.approver.start()

    def kill_midstream(self, answered_target: int) -> _Kill:
        """After a completed checkpoint and ``answered_target`` answers: SIGKILL the busiest TaskManager."""
        self._wait(lambda: self._checkpoints()["counts"]["completed"] >= 1 and self._answered() >= answered_target,
                   180, self._report)
        running_on = self.cluster.job_taskmanagers(self.job_id)
        victim = max(running_on, key=running_on.get)
        in_flight, answered = self.server.stats().in_flight, self._answered()
        killed_pid = self.cluster.kill_taskmanager(resource_id=victim)
        kill = _Kill(victim, time.monotonic(), answered, in_flight,
                     # What the restore has to read: the records the last completed checkpoint's pruning left.
                     sum(p.high - p.low for p in summarize_topic({"bootstrap.servers": self.bootstrap},
                                                                 self.journal_topic)))
        self.progress(f"killed TaskManager {victim} (pid {killed_pid}) with SIGKILL: {answered} tickets answered, "
                      f"{in_flight} calls in flight")
        return kill

    def await_recovery(self, killed_at: float) -> float:
        """Wait until the job runs again on the surviving TaskManager; the seconds since the kill."""
        survivors = set(self.cluster.taskmanager_processes())

        def running_again() -> bool:
            return (self._checkpoints()["latest"]["restored"] is not None
                    and self.cluster.job_status(self.job_id) == "RUNNING"
                    and all(t["status"] == "RUNNING" and t["taskmanager"] in survivors
                            for t in self.cluster.job_subtasks(self.job_id)))

        self._wait(running_again, 180, lambda: "waiting for Flink to restore the job on the other TaskManager")
        recovery_s = time.monotonic() - killed_at
        restored = self._checkpoints()["latest"]["restored"]
        self.progress(f"job running again after {recovery_s:.1f} s, restored from checkpoint {restored['id']}")
        return recovery_s

    def finish(self, kill: _Kill, recovery_s: float) -> DemoResult:
        """Wait for every reply to be committed, read the counters, cancel the job; what was measured."""
        wanted = {ticket["ticket_id"] for ticket in self.tickets}
        self._wait(lambda: {row["ticket_id"] for row in self.reader.poll(0.2)} >= wanted, 300, self._report)
        # One more checkpoint commits whatever is still pending (a duplicate would show up now), then read on.
        last = self._checkpoints()["counts"]["completed"]
        poll_until(lambda: self._checkpoints()["counts"]["completed"] > last, 60,
                   lambda: self.cluster.job_diagnostics(self.job_id))
        rows = self.reader.read_to_committed_end()
        self.progress(f"all replies committed; {self._report()}")
        approvals = self.approver.settle(lambda: self.cluster.job_diagnostics(self.job_id))
        metrics = _agent_metrics(self.cluster, self.job_id)
        self.cluster.cancel_job(self.job_id)
        stats, seen, lookups = self.server.stats(), Counter(row["ticket_id"] for row in rows), self._lookups()
        remembered = _remembered_tickets(self.chroma_url)
        journal = summarize_topic({"bootstrap.servers": self.bootstrap}, self.journal_topic)
        runs_traced, recovered = self._traces()
        return DemoResult(
            tickets=len(self.tickets), chat_calls=stats.chat, order_calls=lookups.calls,
            # classify, then the tool loop: one turn, or two when the model looks the order up first
            expected_chat_calls=2 * len(self.tickets) + sum(1 for t in self.tickets if t["order_id"]),
            expected_order_calls=sum(1 for t in self.tickets if t["order_id"]),
            repeated_calls=stats.repeated + lookups.repeated, idempotent_replays=stats.idempotent_replays,
            order_lookups_resent=lookups.resent, replies=len(seen),
            missing=len(wanted - seen.keys()), duplicates=sum(n - 1 for n in seen.values()),
            embedding_calls=stats.embeddings, memories=sum(remembered.values()),
            duplicate_memories=sum(n - 1 for n in remembered.values()),
            replies_using_memory=sum(1 for row in rows if row.get("past_issues")), killed=kill.victim,
            answered_at_kill=kill.answered, calls_in_flight_at_kill=kill.in_flight, recovery_s=recovery_s,
            restore_read_s=metrics["last_restore_duration_ms"]["max"] / 1000,
            records_read_at_restore=kill.journal_records, actions_reused=int(metrics["actions_reused"]["sum"]),
            journal_written=sum(p.high for p in journal), journal_pruned=sum(p.low for p in journal),
            seconds=time.monotonic() - self.progress.begun,
            approvals=replace(approvals, refunds_paid=stats.refunds,
                              replies_refunded=sum(1 for row in rows if str(row.get("refund", "")).startswith("R-"))),
            runs_traced=runs_traced, viewer_url=self.viewer_url, recovered_trace_url=recovered,
        )

    def _traces(self) -> tuple[int, str]:
        """How many runs Phoenix holds a trace of (their spans were flushed at the last checkpoint; Phoenix stores
        them a moment later), and the page of one whose calls were reused after the kill."""
        from flink_agents_replay.local.phoenix_server import read_spans, trace_url

        def roots(spans: list[dict]) -> list[dict]:
            return [span for span in spans if span["parent_id"] is None]

        def all_runs() -> list[dict] | None:
            spans = read_spans(self.viewer_url, AGENT_ID)
            return spans if len(roots(spans)) >= len(self.tickets) else None

        try:
            spans = poll_until(all_runs, 60, "the runs' traces in Phoenix", interval_s=0.5)
        except TimeoutError:
            spans = read_spans(self.viewer_url, AGENT_ID)
        recovered = next((span["trace_id"] for span in spans if span["attributes"].get("flink_agents.call.reused")),
                         None)
        return len(roots(spans)), trace_url(self.viewer_url, AGENT_ID, recovered) if recovered else ""

    def stop(self) -> None:
        """Stop everything started (Kafka clients first: without the broker they would only log errors)."""
        if self.feeder is not None:
            self.feeder.stop()
        if self.approver is not None:
            self.approver.stop()
        if self.reader is not None:
            self.reader.close()
        self.progress("stopping Flink, Chroma, Phoenix, the MCP orders server, the model service and Kafka")
        if self._viewer_start is not None:
            self._viewer_start.join()  # a start under way must end before the server can be stopped
        stop_viewer = self.viewer.stop if self.viewer is not None else (lambda: None)
        for stop in (self.cluster.stop, self.chroma.stop, stop_viewer, self.mcp.stop, self.server.stop,
                     self.broker.discard):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - keep cleaning up; say what did not stop
                self.progress(f"while stopping: {exc}")
        if self.failed:
            kept = Path(tempfile.gettempdir()) / f"far-demo-logs-{int(time.time())}"
            shutil.copytree(self.work, kept, ignore=shutil.ignore_patterns("data", "checkpoints", "*.jar"),
                            dirs_exist_ok=True, ignore_dangling_symlinks=True, symlinks=True)
            self.progress(f"logs kept in {kept}")
        shutil.rmtree(self.work, ignore_errors=True)
        if self._previous_log_file is None:
            os.environ.pop(self._log_env, None)
        else:
            os.environ[self._log_env] = self._previous_log_file

    def _checkpoints(self) -> dict:
        return self.cluster.rest_get(f"/jobs/{self.job_id}/checkpoints")

    def _lookups(self) -> _Lookups:
        return _Lookups.of(self.mcp.calls("lookup_order"))

    def _answered(self) -> int:
        """Tickets answered, by the model calls made: 2 per ticket, 3 with an order lookup (counted apart)."""
        stats = self.server.stats()
        return max(0, stats.chat - self._lookups().calls) // 2

    def _report(self) -> str:
        stats = self.server.stats()
        return (f"fed {self.feeder.fed}/{len(self.tickets)}, model calls {stats.chat}, order lookups "
                f"{self._lookups().calls}, "
                f"replies committed {len({row['ticket_id'] for row in self.reader.poll(0.1)})}, "
                f"checkpoints {self._checkpoints()['counts']['completed']}")

    def _wait(self, condition: Callable[[], bool], timeout_s: float, report: Callable[[], str]) -> None:
        _wait(condition, timeout_s, self.progress, report, lambda: self.cluster.job_diagnostics(self.job_id))


class _Background:
    """A function run on a thread of its own; :meth:`result` waits for it and returns its value or raises."""

    def __init__(self, function: Callable[[], object]) -> None:
        self._outcome: list = []
        self._thread = threading.Thread(target=self._run, args=(function,), daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], object]) -> None:
        try:
            self._outcome.append((True, function()))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the result
            self._outcome.append((False, exc))

    def join(self) -> None:
        self._thread.join()

    def result(self):
        self.join()
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value


@dataclass(frozen=True)
class _Lookups:
    """The order lookups the MCP server executed, by the idempotency key each request carried in ``_meta`` (the
    agent's call id: the same in every attempt of a call).

    Why by key: a lookup is ``none`` (read-only), so one in flight at the kill is made again after the restore under
    the same call id, and the server, which runs every lookup it is asked, executes it twice. That is one call made
    again, not a new one: counted once (``calls``) and reported apart (``resent``). A lookup of the same order under
    another key would be the agent asking the same question twice (``repeated``: expected 0).
    """

    calls: int  # distinct calls executed (distinct keys; a request without a key counts on its own)
    resent: int  # executions of a key executed before
    repeated: int  # calls beyond the first for the same order

    @classmethod
    def of(cls, requests: list[dict]) -> _Lookups:
        executed = [(r["arguments"]["order_id"], r["idempotency_key"] or f"no key #{n}")
                    for n, r in enumerate(requests) if r["executed"]]
        keys = [key for _, key in executed]
        orders = Counter(order for order, _ in set(executed))
        return cls(calls=len(set(keys)), resent=len(keys) - len(set(keys)),
                   repeated=sum(n - 1 for n in orders.values()))


def _remembered_tickets(chroma_url: str) -> Counter:
    """How many current memories the agent's long-term memory holds per ticket (1 each: none twice)."""
    from flink_agents_replay.integrations.chroma import ChromaVectorStore
    from flink_agents_replay.integrations.vector_store import Where
    from flink_agents_replay.longterm.versions import CURRENT

    with ChromaVectorStore(chroma_url) as store:
        docs = store.get(f"{AGENT_ID}/memory", Where((("kind", "eq", "version"), ("valid_to", "eq", CURRENT))))
    return Counter(doc.metadata["m.ticket_id"] for doc in docs)


def _agent_metrics(cluster, job_id: str) -> dict[str, dict[str, float]]:
    """The agent operator's ``actions_reused`` (sum over subtasks) and ``last_restore_duration_ms`` (max), from
    Flink's REST API, read while the job still runs.

    Why these and how: the operator counts in Flink's metric group, and a TaskManager killed with SIGKILL takes
    its subtasks' counters with it; the REST API reports the current attempt only. Both figures belong to that
    attempt: it is the restored one (the kill restarts every subtask, the job being one pipelined region), the
    first attempt started from nothing and reused nothing, and the restore time is measured by the restored
    subtasks. Figures that span both attempts (calls made, requests repeated) are read where they survive the
    kill: the model and order service's own counters. The REST API answers from metrics it fetched at most
    ``metrics.fetcher.update-interval`` (1 s on the local cluster) earlier, and fetches when first asked: the
    first answers can be empty; the job is idle by now (every reply committed, one checkpoint later), so the
    first complete answer is the final one.
    """
    names = ("actions_reused", "last_restore_duration_ms")

    def complete() -> dict[str, dict[str, float]] | None:
        metrics = cluster.operator_metrics(job_id, _METRIC_GROUP, names)
        return metrics if all(name in metrics for name in names) else None

    return poll_until(complete, 60, lambda: f"the agent's metrics {names} over Flink's REST API", interval_s=0.5)


def _wait(condition: Callable[[], bool], timeout_s: float, progress: _Progress, report: Callable[[], str],
          diagnostics: Callable[[], str], every_s: float = 5.0) -> None:
    """Wait for ``condition``, printing ``report()`` every ``every_s`` seconds."""
    last = time.monotonic()

    def check() -> bool:
        nonlocal last
        if condition():
            return True
        if time.monotonic() - last >= every_s:
            progress(report())
            last = time.monotonic()
        return False

    try:
        poll_until(check, timeout_s, "", interval_s=0.2)
    except TimeoutError:
        raise TimeoutError(f"the demo waited {timeout_s:.0f} s in vain: {report()}\n{diagnostics()}") from None


class _Feeder(threading.Thread):
    """Writes the tickets to the input topic at a steady rate (keyed by customer: one partition per customer)."""

    def __init__(self, bootstrap: str, topic: str, tickets: list[dict], per_second: float):
        super().__init__(name="ticket-feeder", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOGGER,
                                  "enable.idempotence": True})
        self.topic = topic
        self.tickets = tickets
        self.interval_s = 1.0 / per_second
        self.fed = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        for ticket in self.tickets:
            if self._stopped.wait(max(0.0, next_at - time.monotonic())):
                break
            produce_tickets(self.producer, self.topic, [ticket])
            self.fed += 1
            next_at += self.interval_s
        self.producer.flush(30)

    def stop(self) -> None:
        """Stop feeding; wait for what was produced to be delivered, then let the producer go."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=60)
        self.producer = None  # destroyed now, not when the broker is already gone


class _Approver(threading.Thread):
    """The people who decide: reads the job's committed wait events and answers each opened wait on the decisions
    topic. By the wait id's hash: one in ten is answered twice (a duplicate), two in ten are left to time out and
    answered after their deadline (late), two are denied, the rest approved."""

    def __init__(self, bootstrap: str):
        super().__init__(name="approver", daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOGGER,
                                  "enable.idempotence": True})
        self.events = CommittedReader(bootstrap, _WAITS_TOPIC, decode=json.loads)
        self.counts = Approvals()
        self._answered: set[str] = set()
        self._late: list[tuple[float, dict]] = []  # (send after, the opened event)
        self._stopped = threading.Event()
        self.seen: list[dict] = []  # the events read so far (a copy: the reader is this thread's alone)

    def run(self) -> None:
        while not self._stopped.wait(0.3):
            events = self.events.poll(0.2)
            self._answer_new(events)
            self._send_late()
            self.seen = list(events)

    def _answer_new(self, events: list[dict]) -> None:
        for event in events:
            if event["kind"] != "opened" or event["wait_id"] in self._answered:
                continue
            self._answered.add(event["wait_id"])
            self.counts.asked += 1
            choice = int(hashlib.sha256(event["wait_id"].encode()).hexdigest(), 16) % 10
            if choice < 2:  # left to time out, then answered
                self._late.append((event["deadline_ms"] / 1000 + 3, event))
            elif choice < 4:
                self._decide(event, approved=False, reason="over the limit for a refund without a receipt")
            else:
                self._decide(event, approved=True)
                if choice == 4:
                    self._decide(event, approved=True)
                    self.counts.duplicates_sent += 1

    def _send_late(self) -> None:
        due = [event for at, event in self._late if at <= time.time()]
        self._late = [(at, event) for at, event in self._late if at > time.time()]
        for event in due:
            self._decide(event, approved=True)
            self.counts.late_sent += 1

    def _decide(self, event: dict, *, approved: bool, reason: str | None = None) -> None:
        decision = {"key": event["key"], "wait_id": event["wait_id"], "approved": approved, "reason": reason,
                    "by": "demo", "signal_id": secrets.token_hex(8), "sent_at_ms": int(time.time() * 1000)}
        self.producer.produce(_DECISIONS_TOPIC, key=str(event["key"]).encode(), value=json.dumps(decision).encode())
        self.producer.flush(30)
        self.counts.sent += 1

    def settle(self, diagnostics: Callable[[], str]) -> Approvals:
        """Once every reply is committed: wait for the late decisions and for the job to report every odd one; the
        counts of what was asked and decided, from the wait events."""
        def settled() -> bool:  # every decision sent is applied or reported ignored
            applied = sum(1 for e in self.seen if e["kind"] == "resumed" and not e["decision"]["timed_out"])
            ignored = sum(1 for e in self.seen if e["kind"] == "decision_ignored")
            return not self._late and applied + ignored >= self.counts.sent

        poll_until(settled, APPROVAL_TIMEOUT_S + 60, lambda: f"late decisions and their reports: {diagnostics()}")
        events = self.seen
        resumed = Counter(e["wait_id"] for e in events if e["kind"] == "resumed")
        decided = {e["wait_id"]: e["decision"] for e in events if e["kind"] == "resumed"}
        return replace(self.counts, asked=len({e["wait_id"] for e in events if e["kind"] == "opened"}),
                       approved=sum(1 for d in decided.values() if d["approved"] and not d["timed_out"]),
                       denied=sum(1 for d in decided.values() if d["approved"] is False and not d["timed_out"]),
                       timed_out=sum(1 for d in decided.values() if d["timed_out"]),
                       resumed_twice=sum(1 for n in resumed.values() if n > 1),
                       ignored=sum(1 for e in events if e["kind"] == "decision_ignored"))

    def stop(self) -> None:
        """Stop answering; let the clients go (before the broker stops)."""
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=30)
        self.events.close()
        self.producer = None
