"""A small MCP server of orders (the official ``mcp`` SDK's FastMCP), for the demo and the tests.

Tools:

* ``lookup_order(order_id)``: the order's status, items, total and carrier, the same data the local model
  service's ``GET /orders/<id>`` answers (:func:`flink_agents_replay.local.model_replies.order_details`).
  Annotated read-only and idempotent.
* ``issue_refund(order_id, amount)``: pays a refund (an effect: annotated neither read-only nor idempotent). It
  honours the idempotency key a client sends in the request's ``_meta`` (``idempotency_key``): a refund asked
  again under a key already paid answers the first refund and pays nothing. ``amount`` must be positive, or the
  tool fails (an ``isError`` result).
* ``tag_order(order_id, tag)``: sets a tag on an order (annotated idempotent, not read-only).

With ``--delay-s`` (or ``$FLINK_AGENTS_REPLAY_MCP_DELAY_S``) each tool answers that many seconds after it took
effect: a client killed, or a server killed, in between leaves a call in doubt whose effect happened.

Every request a tool gets is recorded in a SQLite file (``--db``, else ``$FLINK_AGENTS_REPLAY_MCP_DB``, else
``mcp_orders.sqlite3`` in the working directory), with the ``_meta`` key it carried, whether it took effect
(``executed``) and the server's process id, so that tests count executions outside the process that calls the
tools: :func:`read_calls`. Several server processes may share the file (each stdio client starts its own).

Run it::

    python -m flink_agents_replay.local.mcp_orders_server --stdio
    python -m flink_agents_replay.local.mcp_orders_server --http --port 8765   # http://127.0.0.1:8765/mcp

or as a detached process serving HTTP (the demo): :class:`LocalMcpOrdersServer`, its state, log and SQLite file in a
work directory.
"""

import argparse
import asyncio
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations
from pydantic import Field

from flink_agents_replay.local.model_replies import order_details
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    log_tail,
    pid_alive,
    spawn_service,
    wait_until_ready,
)

__all__ = ["DB_ENV", "DELAY_ENV", "LocalMcpOrdersServer", "build_server", "main", "read_calls"]

#: Where the server records the requests it gets, unless ``--db`` says.
DB_ENV = "FLINK_AGENTS_REPLAY_MCP_DB"
#: An order's id as the tools' schemas give it: a model (the local model service too) fills it from a ticket's text.
#: The pattern is not anchored: JSON Schema's ``pattern`` matches anywhere in a string, and the local model service
#: searches the ticket's text with it (``^O-\d+$`` finds nothing there). The tools check the whole id themselves.
OrderId = Annotated[str, Field(pattern=r"O-\d+", description="the order's id, like O-12345")]
_WHOLE_ORDER_ID = re.compile(r"O-\d+")

#: Seconds each tool waits between taking effect and answering, unless ``--delay-s`` says (default 0).
DELAY_ENV = "FLINK_AGENTS_REPLAY_MCP_DELAY_S"
_SCHEMA = """CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    idempotency_key TEXT,
    executed INTEGER NOT NULL,
    result TEXT,
    pid INTEGER NOT NULL
)"""


def _connect(db: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(db, timeout=30, isolation_level=None)  # transactions by hand
    connection.execute(_SCHEMA)
    return connection


def _key(ctx: Context) -> str | None:
    """The idempotency key in the request's ``_meta``, if the client sent one."""
    meta = ctx.request_context.meta
    key = getattr(meta, "idempotency_key", None) if meta is not None else None
    return key if isinstance(key, str) else None


def _checked(order_id: str) -> str:
    """``order_id`` if it is a whole order id (O- and digits); else the tool fails (an ``isError`` result)."""
    if not _WHOLE_ORDER_ID.fullmatch(order_id):
        raise ValueError(f"an order id is O- and digits, like O-12345, not {order_id!r}")
    return order_id


def _record(db: Path, tool: str, arguments: dict[str, Any], key: str | None, executed: bool, result: Any) -> None:
    with contextlib.closing(_connect(db)) as connection:
        connection.execute("INSERT INTO calls (tool, arguments, idempotency_key, executed, result, pid) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           (tool, json.dumps(arguments, sort_keys=True), key, int(executed),
                            json.dumps(result, sort_keys=True), os.getpid()))


def _refund(db: Path, order_id: str, amount: float, key: str | None) -> dict[str, Any]:
    """Pays once per idempotency key: the check and the payment are one transaction (several server processes)."""
    connection = _connect(db)
    try:
        connection.execute("BEGIN IMMEDIATE")
        paid = connection.execute("SELECT result FROM calls WHERE tool = 'issue_refund' AND executed = 1 AND "
                                  "idempotency_key = ? ORDER BY seq LIMIT 1", (key,)).fetchone() if key else None
        refund = json.loads(paid[0]) if paid else {
            "refund_id": f"R-{order_id}", "order_id": order_id, "amount": amount, "status": "refunded"}
        connection.execute("INSERT INTO calls (tool, arguments, idempotency_key, executed, result, pid) "
                           "VALUES (?, ?, ?, ?, ?, ?)",
                           ("issue_refund", json.dumps({"order_id": order_id, "amount": amount}, sort_keys=True),
                            key, int(paid is None), json.dumps(refund, sort_keys=True), os.getpid()))
        connection.execute("COMMIT")
        return refund
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    finally:
        connection.close()


def build_server(db: str | os.PathLike[str], *, port: int = 8000, delay_s: float = 0.0) -> FastMCP:
    """The server, recording into ``db``; ``port`` for ``--http`` (bound to 127.0.0.1); each tool answers
    ``delay_s`` seconds after taking effect."""
    path = Path(db)
    _connect(path).close()
    server = FastMCP("orders", host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True, openWorldHint=False))
    async def lookup_order(order_id: OrderId, ctx: Context) -> dict[str, Any]:
        """Look up an order: its status, items, total and carrier.

        Args:
            order_id: the order's id, like O-12345.
        """
        order = order_details(_checked(order_id))
        _record(path, "lookup_order", {"order_id": order_id}, _key(ctx), True, order)
        await asyncio.sleep(delay_s)
        return order

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False,
                                             openWorldHint=True))
    async def issue_refund(order_id: OrderId, amount: float, ctx: Context) -> dict[str, Any]:
        """Refund an order: money goes back to the customer.

        Args:
            order_id: the order's id.
            amount: how much to pay back, in euros.
        """
        _checked(order_id)
        if not amount > 0:
            raise ValueError(f"a refund must be a positive amount, not {amount}")
        refund = _refund(path, order_id, amount, _key(ctx))
        await asyncio.sleep(delay_s)
        return refund

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True))
    async def tag_order(order_id: OrderId, tag: str, ctx: Context) -> dict[str, Any]:
        """Set a tag on an order (setting it again changes nothing).

        Args:
            order_id: the order's id.
            tag: the tag.
        """
        result = {"order_id": _checked(order_id), "tag": tag}
        _record(path, "tag_order", result, _key(ctx), True, result)
        await asyncio.sleep(delay_s)
        return result

    return server


def read_calls(db: str | os.PathLike[str], tool: str | None = None) -> list[dict[str, Any]]:
    """The requests the server got, in order (of ``tool`` only, if given): ``tool``, ``arguments``,
    ``idempotency_key``, ``executed`` (whether it took effect), ``result``, ``pid``."""
    if not Path(db).exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as connection:
        connection.execute(_SCHEMA)
        rows = connection.execute("SELECT tool, arguments, idempotency_key, executed, result, pid FROM calls "
                                  "WHERE ? IS NULL OR tool = ? ORDER BY seq", (tool, tool)).fetchall()
    return [{"tool": name, "arguments": json.loads(arguments), "idempotency_key": key, "executed": bool(executed),
             "result": json.loads(result) if result else None, "pid": pid}
            for name, arguments, key, executed, result, pid in rows]


class LocalMcpOrdersServer(RecordedProcess):
    """The orders server as a detached process serving streamable HTTP on 127.0.0.1 (the demo), its state file
    (PID, port), log and SQLite file in ``work_dir``.

    Args:
        work_dir: directory for the state file, the log and the SQLite file; created if missing.
        port: port on 127.0.0.1; ``0`` picks a free one.
        delay_s: seconds each tool waits between taking effect and answering.
        start_timeout_s: how long :meth:`start` waits for the MCP endpoint to answer.
    """

    def __init__(self, work_dir: str | os.PathLike[str], *, port: int = 0, delay_s: float = 0.0,
                 start_timeout_s: float = 30.0):
        self.work_dir = Path(work_dir)
        self.port = port
        self.delay_s = delay_s
        self.start_timeout_s = start_timeout_s

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "mcp-orders-server.json"

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.work_dir / "mcp-orders-server.log"

    @property
    def db(self) -> Path:
        """The SQLite file of the requests the server got (:func:`read_calls`)."""
        return self.work_dir / "mcp-orders.sqlite3"

    @property
    def url(self) -> str | None:
        """The MCP endpoint, ``http://127.0.0.1:<port>/mcp``, or ``None`` when the server does not run."""
        state = self._read_state()
        return f"http://127.0.0.1:{state['port']}/mcp" if state and pid_alive(state["pid"]) else None

    def start(self) -> str:
        """Start the server (or take the one already running here) and wait until its MCP endpoint answers; its
        URL."""
        if self.url is not None:
            return self.url
        port = claim_port(self.port, what="MCP orders server")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # The child imports this very package, even from a checkout that is not installed.
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        with open(self.log_file, "ab") as out:
            process = spawn_service(
                [sys.executable, "-m", "flink_agents_replay.local.mcp_orders_server", "--http", "--port", str(port),
                 "--db", str(self.db), "--delay-s", str(self.delay_s)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.work_dir,  # outlives the caller; stopped by PID
            )
        self._state_file.write_text(json.dumps({"pid": process.pid, "port": port}))
        url = f"http://127.0.0.1:{port}/mcp"
        try:
            wait_until_ready(process, lambda: _answers_mcp(url), what="the MCP orders server", where=url,
                             timeout_s=self.start_timeout_s, log_tail=lambda: log_tail(self.log_file),
                             interval_s=0.05)
        except BaseException:
            self.stop()
            raise
        return url

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The requests the server got (:func:`read_calls`)."""
        return read_calls(self.db, tool)

    def lookups(self) -> int:
        """``lookup_order`` requests executed (a call made again under the same idempotency key counts again)."""
        return sum(1 for call in self.calls("lookup_order") if call["executed"])


def _answers_mcp(url: str) -> bool:
    """Whether an MCP server answers at ``url``: its reply to an ``initialize`` request is a 200."""
    body = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "flink-agents-replay readiness check", "version": "0"}}}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flink_agents_replay.local.mcp_orders_server",
                                     description="A small MCP server of orders (lookup_order, issue_refund).")
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--stdio", action="store_true", help="serve over stdin and stdout")
    transport.add_argument("--http", action="store_true", help="serve streamable HTTP at http://127.0.0.1:PORT/mcp")
    parser.add_argument("--port", type=int, default=8000, help="the HTTP port (default 8000)")
    parser.add_argument("--db", default=os.environ.get(DB_ENV) or "mcp_orders.sqlite3",
                        help=f"the SQLite file of the requests (default ${DB_ENV}, else ./mcp_orders.sqlite3)")
    parser.add_argument("--delay-s", type=float, default=float(os.environ.get(DELAY_ENV) or 0),
                        help=f"seconds each tool waits between taking effect and answering (default ${DELAY_ENV}, "
                             "else 0)")
    options = parser.parse_args(argv)
    server = build_server(options.db, port=options.port, delay_s=options.delay_s)
    server.run("stdio" if options.stdio else "streamable-http")


if __name__ == "__main__":
    main()
