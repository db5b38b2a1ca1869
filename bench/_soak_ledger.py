"""The chaos soak's external service: a ledger that honours idempotency keys and counts real executions.

``POST /ledger`` with ``{"ticket_id", "customer", "amount"}`` books the amount and answers a receipt that is a
pure function of the request. A request with an ``Idempotency-Key`` it has executed before is answered from
its store without executing again (a call in doubt re-sent after a crash); one arriving while the first is
still under way waits for it. Every real execution is counted per ticket (the *logical call*) in a SQLite
file (:class:`~flink_agents_replay.testing.counter.InvocationCounter`), so "each logical call executed once"
is checked on counts kept outside the Flink worker, which a killed TaskManager cannot lose. The store of
answers is kept in the same file.

It is a Starlette application served by uvicorn on a thread of the soak's process, like the stub model
service (``StubModelServer``): the event loop only routes requests and orders those of one key; the booking's
blocking work (its delay, SQLite) runs on the thread pool. A caller gone before its reply (a killed
TaskManager) is not an error: the booking stands and its key is stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from flink_agents_replay.testing.counter import InvocationCounter

__all__ = ["LedgerService", "LedgerStats", "receipt_of"]


def receipt_of(ticket_id: str, customer: str, amount: int) -> str:
    """The receipt of a booking: a digest of the request."""
    return hashlib.sha256(f"{ticket_id}|{customer}|{amount}".encode()).hexdigest()[:12]


@dataclass(frozen=True)
class LedgerStats:
    """What the ledger saw: executions (real bookings), answers from the store, requests under way now."""

    executions: int
    idempotent_replays: int
    in_flight: int
    without_key: int


class _Ledger:
    """The state behind the HTTP application.

    ``book`` runs on the server's event loop (one loop: ``under_way`` needs no lock); the counters and the SQLite
    connection are shared with the thread pool and with callers of ``stats`` under ``lock``.
    """

    def __init__(self, path: Path, delay_s: float):
        self.counter = InvocationCounter(path)
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)  # notified when no booking is executing
        self.under_way: dict[str, asyncio.Event] = {}  # key -> set when its request is answered or failed
        self.executions = self.replays = self.in_flight = self.without_key = 0
        self.db = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
        with self.db:
            self.db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, body TEXT NOT NULL)")

    def _stored(self, key: str) -> str | None:
        with self.lock:
            row = self.db.execute("SELECT body FROM answers WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            self.replays += 1
            return row[0]

    async def book(self, request: dict, key: str | None) -> str:
        """Execute the booking, or answer it from the store by its key; one request per key at a time."""
        if key is None:
            return await run_in_threadpool(self._execute, request, None)
        while (waiting := self.under_way.get(key)) is not None:
            await waiting.wait()  # the request under way with this key, answered (stored) or failed (not)
        self.under_way[key] = asyncio.Event()
        try:
            stored = await run_in_threadpool(self._stored, key)
            if stored is not None:
                return stored
            return await run_in_threadpool(self._execute, request, key)
        finally:
            self.under_way.pop(key).set()

    def _execute(self, request: dict, key: str | None) -> str:
        with self.lock:
            self.in_flight += 1
            self.without_key += key is None
        try:
            time.sleep(self.delay_s)  # the work: a slow service, so calls are under way when faults hit
            self.counter.increment(f"ticket:{request['ticket_id']}")
            body = json.dumps({"receipt": receipt_of(request["ticket_id"], request["customer"], request["amount"])})
            with self.lock:
                self.executions += 1
                if key is not None:
                    with self.db:
                        self.db.execute("INSERT INTO answers (key, body) VALUES (?, ?)", (key, body))
            return body
        finally:
            with self.lock:
                self.in_flight -= 1
                if not self.in_flight:
                    self.idle.notify_all()

    def wait_idle(self, timeout_s: float) -> None:
        """Wait (bounded) until no booking is executing."""
        with self.lock:
            self.idle.wait_for(lambda: not self.in_flight, timeout_s)

    def stats(self) -> LedgerStats:
        with self.lock:
            return LedgerStats(self.executions, self.replays, self.in_flight, self.without_key)

    def executions_per_ticket(self) -> dict[str, int]:
        return {name.split(":", 1)[1]: n for name, n in self.counter.counts().items() if name.startswith("ticket:")}


async def _post_ledger(request: Request) -> Response:
    ledger: _Ledger = request.app.state.ledger
    try:
        booking = json.loads(await request.body())
        booking["ticket_id"], booking["customer"], booking["amount"]  # noqa: B018 - all three, or a 400
    except ClientDisconnect:
        return Response(status_code=400)  # its caller went away while sending it: nothing booked, nobody to answer
    except (ValueError, TypeError, KeyError):
        return Response('a booking is {"ticket_id", "customer", "amount"}', status_code=400)
    try:
        body = await ledger.book(booking, request.headers.get("Idempotency-Key"))
    except asyncio.CancelledError:  # the service stopped with it under way; its booking finishes on its thread
        return Response(status_code=503)  # not sent: its connection is cut already
    # Sent even if its caller is gone (a killed TaskManager): uvicorn drops it quietly; the key is stored.
    return Response(body, media_type="application/json")


def _application(ledger: _Ledger) -> Starlette:
    app = Starlette(routes=[Route("/ledger", _post_ledger, methods=["POST"])])
    app.state.ledger = ledger
    return app


class LedgerService:
    """The ledger on a free port of 127.0.0.1, in a thread; ``path`` is its SQLite file."""

    def __init__(self, path: Path, *, delay_ms: float = 0):
        self._ledger = _Ledger(Path(path), delay_ms / 1000)
        # Listening from here on: the port (``base_url``) is known before ``start``, and clients can connect at once.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(1024)
        self._port = self._socket.getsockname()[1]
        # No access log, no lifespan; no signal handlers (uvicorn installs none off the main thread).
        self._server = uvicorn.Server(uvicorn.Config(_application(self._ledger), log_level="warning",
                                                     access_log=False, lifespan="off", timeout_graceful_shutdown=0))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> LedgerService:
        if self._thread is not None:
            return self
        loop_running = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(loop_running),), name="soak-ledger",
                                        daemon=True)
        self._thread.start()
        loop_running.wait()
        return self

    async def _serve(self, loop_running: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        loop_running.set()
        await self._server.serve(sockets=[self._socket])

    def stop(self) -> None:
        """Stop serving and close the socket; open connections are cut. Bookings already executing finish (and
        store their keys) before it returns, as long as their delay and some seconds."""
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._abandon_requests)
            self._thread.join()
        self._socket.close()
        self._ledger.wait_idle(self._ledger.delay_s + 10)
        self._thread = self._loop = None

    def _abandon_requests(self) -> None:
        """On the server's loop: cut every open connection, then end the server without waiting for requests."""
        for connection in list(self._server.server_state.connections):
            connection.transport.abort()
        self._server.should_exit = self._server.force_exit = True

    def stats(self) -> LedgerStats:
        return self._ledger.stats()

    def executions_per_ticket(self) -> dict[str, int]:
        """Real executions of each logical call (one booking per ticket)."""
        return self._ledger.executions_per_ticket()
