"""MCP servers that die during a call: the call is never lost, never left hanging, never made under a new key.

Found by the MCP SIGKILL integration test's author: an HTTP server killed during a call left the call waiting for
ever (the SDK keeps the answer's stream open with nothing to come), and a server down longer than the retries
made the call a failure, which the next attempt made again under a new call id: a refund paid twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from flink_agents_replay.api.mcp_tools import McpServer, mcp_tools
from flink_agents_replay.core.errors import McpCallInDoubtError
from flink_agents_replay.integrations.mcp_client import PING_EVERY_S, session_pool
from flink_agents_replay.local.mcp_orders_server import read_calls
from flink_agents_replay.local.processes import free_port
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from tests.unit.test_mcp_tools import SERVER_MODULE, ScriptedModel, calls_with, refund_agent, run


@pytest.fixture(autouse=True)
def sessions_closed():
    yield
    session_pool().close_sessions()


def wait_for(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling the server's record, not a wait standing in for it


def http_server(db, port: int, delay_s: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, "--http", "--port", str(port), "--db", str(db),
                                "--delay-s", str(delay_s)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        assert process.poll() is None, "the MCP server exited"
        return False

    wait_for(listening, f"the MCP server on port {port}")
    return process


def test_an_http_server_killed_during_a_call_and_restarted_answers_that_call_under_its_key(tmp_path):
    db, port = tmp_path / "orders.sqlite3", free_port()
    process = http_server(db, port, delay_s=1.0)
    key, outcome = f"killed-during:{uuid.uuid4().hex[:8]}", {}
    server = McpServer(url=f"http://127.0.0.1:{port}/mcp")
    caller = threading.Thread(target=lambda: outcome.update(result=session_pool().call_tool(
        server, "issue_refund", {"order_id": "O-7", "amount": 7.0}, idempotency_key=key)))
    try:
        caller.start()
        wait_for(lambda: calls_with(db, key), "the refund to take effect")  # paid; its answer comes 1 s later
        process.kill()
        process.wait(timeout=10)
        process = http_server(db, port, delay_s=0.0)
        caller.join(timeout=4 * PING_EVERY_S + 10)
        assert not caller.is_alive(), "the call still waits for an answer the dead server will never send"
    finally:
        process.kill()
    paid = calls_with(db, key)
    assert [call["executed"] for call in paid] == [True, False]  # paid once; the new server answered from it
    assert outcome["result"] == paid[0]["result"]


def test_a_call_sent_to_a_server_that_stays_down_is_in_doubt_and_the_next_attempt_pays_nothing_twice(tmp_path):
    db, allowed = tmp_path / "orders.sqlite3", tmp_path / "server-may-start"
    allowed.touch()
    server = McpServer(command="sh", args=["-c", f"test -f {allowed} && exec {sys.executable} -m {SERVER_MODULE} "
                                                 f"--stdio --db {db} --delay-s 1.0"],
                       env={"PATH": os.environ["PATH"]})
    agent, store = refund_agent({"issue_refund": mcp_tools(server)["issue_refund"]}, ScriptedModel()), \
        MemoryJournalStore(8)

    def kill_the_server_after_the_payment() -> None:
        wait_for(lambda: read_calls(db, "issue_refund"), "the refund to take effect")
        allowed.unlink()  # it stays down for longer than the retries
        os.kill(read_calls(db, "issue_refund")[0]["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server_after_the_payment)
    killer.start()
    with pytest.raises(McpCallInDoubtError, match="was sent and may have taken effect"):
        run(agent, store, "cust", "O-00042")
    killer.join()
    allowed.touch()  # the server is back
    resumed = run(agent, store, "cust", "O-00042", recover=True)
    assert resumed.stats.calls_in_doubt == 1 and resumed.outputs
    requests = read_calls(db, "issue_refund")
    assert [call["executed"] for call in requests] == [True, False]  # paid once; answered from it under its key
    assert len({call["idempotency_key"] for call in requests}) == 1
