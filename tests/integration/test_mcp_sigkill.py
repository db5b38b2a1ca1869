"""A tool loop with an MCP tool survives a SIGKILLed TaskManager and a SIGKILLed MCP server: every refund once.

A standalone cluster with two TaskManagers runs ``tests/jobs/mcp_tool_loop_job.py`` (``flink run -py``): per ticket
a tool loop against the local model service (0.3 s per turn) whose one tool is the MCP orders server's
``issue_refund`` (``local/mcp_orders_server.py``, a process of this test, streamable HTTP; ``external``,
``in_doubt='rerun'``, the call id in ``_meta``). The server pays a refund at once and answers ``--delay-s`` later,
so a call cut short is in doubt with its effect made. The server records every request in SQLite (its key, and
whether it paid), the job counts model turns and the tool's answers in another SQLite file: both outside the worker.

Two faults in one job run:

1. **The TaskManager is SIGKILLed** after a checkpoint, at a moment when some tickets' refund was paid and their
   next model turn was asked and had not answered (*between a tool call and the next model turn*), and some
   refund was paid and its answer had not reached the worker (*in doubt*). The other TaskManager takes over.
2. **The MCP server is SIGKILLed** once the restored job has a refund under way on it (paid, not answered), and
   started again on the same port with the same file within half a second. The session pool of the new worker
   finds its session gone and opens another; a call cut short is sent again under its key by the transport's
   retries (or, if it timed out, after its action's failure and Flink's restart: the outcome must be the same).

Checked from outside the worker: every order's refund was *paid* exactly once (server: ``executed=1``); every
request of an order carried one key (its call id), so a refund sent again in doubt, after either kill, had the
first one's key and was answered from the server's store (``executed=0``), at least one after each kill; a ticket
caught between its tool call and its next turn reused both its first turn and its refund (one request, no
re-send); no model request was executed twice; the committed outputs (``read_committed``) are a failure-free run's,
each once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flink_agents_replay.api.mcp_tools import McpServer
from flink_agents_replay.integrations.mcp_client import session_pool
from flink_agents_replay.local.mcp_orders_server import read_calls
from flink_agents_replay.local.processes import free_port, pid_alive
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, make_inputs, produce_inputs, reference_outputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "mcp_tool_loop_job.py"
SERVER_MODULE = "flink_agents_replay.local.mcp_orders_server"
KEYS, PER_KEY = 4, 8
DELAY_S = 0.5  # the server answers this long after paying: a call cut short in it is in doubt, its effect made
# A bound on one MCP call in the job. A call whose HTTP server dies while it waits for the answer is not told (the
# SDK's streamable HTTP client drops the broken response stream of a server that sends no event ids, and the
# request waits on): only the session's next request, failing, ends the session and has the call tried again. A
# last call with no other after it would wait forever; the bound makes it time out (in doubt: its action fails,
# Flink restarts, the call is sent again under its key). Not reached in this test's runs so far.
CALL_TIMEOUT_S = 10.0
# Starts the server as `python -m` does, once a line arrives on stdin, with its modules imported before: a
# restart within the client's transport retries (0.2 + 0.4 + 0.8 s), not a Python start-up (~1 s, more on a
# busy machine) after the kill. A server back later than the retries fails a call cut short with
# McpConnectionError, journaled as the call's outcome: its action fails and the next attempt makes the call again
# under a *new* call id, which the server pays again (a defect of the package, not what this test is about).
_STANDBY = ("import sys, uvicorn, mcp.server.streamable_http_manager; "
            f"from {SERVER_MODULE} import main; sys.stdin.readline(); main(sys.argv[1:])")


class OrdersServer:
    """The MCP orders server as a process of this test, serving streamable HTTP on ``port``."""

    def __init__(self, db: Path, port: int, delay_s: float, log: Path):
        self.db, self.port, self.log = db, port, log
        self.args = ["--http", "--port", str(port), "--db", str(db), "--delay-s", str(delay_s)]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> OrdersServer:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, *self.args],
                                            stdout=subprocess.DEVNULL, stderr=log)
        return self._listening()

    def standby(self) -> OrdersServer:
        """Start the process with its modules loaded, not serving until :meth:`go`."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-c", _STANDBY, *self.args], stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, stderr=log)
        return self

    def go(self) -> OrdersServer:
        self.process.stdin.write(b"go\n")
        self.process.stdin.close()
        return self._listening()

    def _listening(self, timeout_s: float = 30) -> OrdersServer:
        def listens() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the MCP server exited: {self.log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
            return False

        poll_until(listens, timeout_s, f"the MCP server listening on {self.port}", interval_s=0.02)
        return self

    def kill(self) -> int:
        """SIGKILL the server; its pid."""
        self.process.kill()
        self.process.wait(timeout=10)
        return self.process.pid

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()


def _tickets() -> list[tuple[str, int]]:
    return [(record["key"], record["n"]) for record in make_inputs(keys=KEYS, per_key=PER_KEY)]


def refunds_by_order(db: Path) -> dict[str, list[dict]]:
    """The server's ``issue_refund`` requests by order, in order."""
    by_order = defaultdict(list)
    for call in read_calls(db, "issue_refund"):
        by_order[call["arguments"]["order_id"]].append(call)
    return by_order


def paid(db: Path) -> dict[str, dict]:
    """The first paying request of each order paid."""
    return {order: next(call for call in calls if call["executed"])
            for order, calls in refunds_by_order(db).items() if any(call["executed"] for call in calls)}


@pytest.fixture
def orders_servers(tmp_path):
    """The MCP orders server, serving, and its replacement on standby (the same port and file); both ended after
    the test, with the session of the reference's stdio server."""
    db = tmp_path / "orders.sqlite3"
    server = OrdersServer(db, free_port(), DELAY_S, tmp_path / "mcp-server.log")
    standby = OrdersServer(db, server.port, DELAY_S, tmp_path / "mcp-server-restarted.log")
    try:
        yield server.start(), standby.standby()
    finally:
        session_pool().close_sessions()
        standby.stop()
        server.stop()


def test_an_mcp_tool_loop_survives_a_killed_taskmanager_and_a_killed_mcp_server_paying_each_refund_once(
        kafka_bootstrap, new_topic, flink_cluster, model_server, orders_servers, tmp_path):
    inputs = make_inputs(keys=KEYS, per_key=PER_KEY)
    server, standby = orders_servers
    db = server.db
    reference_model, model = model_server(), model_server(delay_ms=300)
    counter = InvocationCounter(tmp_path / "calls.db")
    name = f"mcp-kill-{uuid.uuid4().hex[:6]}"
    with job_script(JOB) as job, ThreadPoolExecutor(1) as background:
        # The failure-free run, in this process against a server of its own (stdio, another file), while the
        # cluster starts.
        reference_server = McpServer(command=sys.executable, args=[
            "-m", SERVER_MODULE, "--stdio", "--db", str(tmp_path / "reference.sqlite3")])
        expected = background.submit(lambda: reference_outputs(job.refund_agent(
            model_url=reference_model.base_url, server=reference_server, name="reference-mcp",
            counter=InvocationCounter(tmp_path / "reference.db")), inputs))
        input_topic, output_topic = produce_inputs(kafka_bootstrap, inputs), new_topic(prefix="mcp-out")
        cluster = flink_cluster(taskmanagers=2)  # one runs the job, the other takes over after the kill
        cluster.start()
        job_id = cluster.submit_python_job(
            JOB, "--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic",
            output_topic, "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path",
            str(counter.path), "--signing-key", "mcp-sigkill-signing-key", "--model-url", model.base_url,
            "--agent-name", name, "--mcp-url", server.url, "--mcp-timeout-s", str(CALL_TIMEOUT_S))
        expected = expected.result()
        orders = {job.order_of(key, n): f"{key}|{n}" for key, n in _tickets()}

    def checkpoints() -> int:
        return cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]

    def between() -> set[str]:
        """Tickets whose refund was paid and whose next turn was asked and has not answered."""
        counts = counter.counts()
        return {orders[order] for order in paid(db) if counts.get(f"turn:2:{orders[order]}", 0)
                and not counts.get(f"answered:2:{orders[order]}", 0)}

    def in_doubt(server_pid: int | None = None) -> set[str]:
        """Orders paid (by the server process ``server_pid``, if given) whose answer has not reached the worker."""
        counts = counter.counts()
        return {order for order, call in paid(db).items() if not counts.get(f"refund-answered:{order}", 0)
                and server_pid in (None, call["pid"])}

    # 1. The TaskManager, with loops between a tool call and the next turn, and refunds in doubt.
    poll_until(lambda: checkpoints() >= 1, 180, lambda: cluster.job_diagnostics(job_id))
    [victim] = cluster.job_taskmanagers(job_id)  # the other one takes over after the kill
    victim_pid = cluster.taskmanager_processes()[victim]
    poll_until(lambda: len(between()) >= 2 and in_doubt(), 60, lambda: cluster.job_diagnostics(job_id),
               interval_s=0.02)
    assert cluster.kill_taskmanager(resource_id=victim) == victim_pid and not pid_alive(victim_pid)
    caught, doubted, paid_at_kill = between(), in_doubt(), set(paid(db))
    assert len(caught) >= 2 and doubted and len(paid_at_kill) < len(orders), (caught, doubted, paid_at_kill)

    # 2. The MCP server, with a refund of the restored job under way on it (paid, not answered).
    first_pid = server.process.pid
    poll_until(lambda: in_doubt(first_pid) - paid_at_kill, 120, lambda: cluster.job_diagnostics(job_id),
               interval_s=0.02)
    server.kill()
    killed_at = time.monotonic()
    cut_short = in_doubt(first_pid) - paid_at_kill
    standby.go()
    restart_s = time.monotonic() - killed_at
    assert cut_short and standby.process.pid != first_pid, cut_short

    with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: tuple(json.loads(value))) as reader:
        poll_until(lambda: set(reader.poll()) >= set(expected), 240, lambda: cluster.job_diagnostics(job_id))
        done = checkpoints()  # one more checkpoint commits anything still pending, duplicates included
        poll_until(lambda: checkpoints() > done, 60, lambda: cluster.job_diagnostics(job_id))
        rows = reader.read_to_committed_end()
    failures = _failures(cluster, job_id)
    cluster.cancel_job(job_id)

    assert Counter(rows) == expected
    requests = refunds_by_order(db)
    assert set(requests) == set(orders), sorted(set(orders) ^ set(requests))  # no refund lost
    executions = {order: sum(call["executed"] for call in calls) for order, calls in requests.items()}
    assert set(executions.values()) == {1}, {o: n for o, n in executions.items() if n != 1}  # none paid twice
    assert all(calls[0]["arguments"]["amount"] == job.amount_of(int(orders[order].rsplit("|", 1)[1]))
               for order, calls in requests.items()), requests  # the model filled the amount from the text
    keys = {order: {call["idempotency_key"] for call in calls} for order, calls in requests.items()}
    assert all(len(k) == 1 and next(iter(k)).startswith(f"{name}:refund:") for k in keys.values()), keys
    resent = {order: calls[1:] for order, calls in requests.items() if len(calls) > 1}
    assert all(calls[0]["executed"] and not call["executed"] and call["result"] == calls[0]["result"]
               for order, calls in requests.items() for call in calls[1:]), resent
    # Each fault hit a call under way, which was sent again under its key and answered from the server's store.
    assert doubted & set(resent), (doubted, sorted(resent))
    after_restart = {order for order, calls in resent.items() if any(c["pid"] == standby.process.pid for c in calls)}
    assert cut_short & after_restart, (cut_short, sorted(after_restart))
    # A loop caught between its refund and its next turn reused both: one request, one first turn.
    counts = counter.counts()
    caught_orders = {order for order, ticket in orders.items() if ticket in caught}
    assert all(len(requests[order]) == 1 for order in caught_orders), {o: requests[o] for o in caught_orders}
    assert all(counts[f"turn:1:{ticket}"] == 1 for ticket in caught), {t: counts[f"turn:1:{t}"] for t in caught}
    stats = model.stats()
    assert stats.repeated == 0 and stats.chat == 2 * len(inputs) and stats.tool_call_replies == len(inputs), stats
    print(f"\nMCP tool loop, TaskManager SIGKILL: {len(caught)} loops between a refund and the next turn (reused), "
          f"{len(doubted)} refunds in doubt ({len(doubted & set(resent))} sent again under their key); MCP server "
          f"SIGKILL with {len(cut_short)} refunds under way ({len(cut_short & after_restart)} sent again to the "
          f"restarted server under their key), restarted in {restart_s:.2f} s; {len(requests)} orders paid once "
          f"each in {sum(len(c) for c in requests.values())} requests; Flink restarts {len(failures)} {failures}; "
          f"model executions {stats.chat} for {len(inputs)} loops, repeated {stats.repeated}, answered by "
          f"idempotency key {stats.idempotent_replays}")


def _failures(cluster, job_id: str) -> list[str]:
    """The job's failures Flink restarted it for (the TaskManager's loss, and any action's failure), oldest first:
    each one's exception name."""
    entries = cluster.rest_get(f"/jobs/{job_id}/exceptions").get("exceptionHistory", {}).get("entries", [])
    return [entry.get("exceptionName", "?").rsplit(".", 1)[-1] for entry in reversed(entries)]
