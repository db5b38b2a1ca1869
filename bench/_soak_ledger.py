"""The chaos soak's external service: a ledger that honours idempotency keys and counts real executions.

``POST /ledger`` with ``{"ticket_id", "customer", "amount"}`` books the amount and answers a receipt that is a
pure function of the request. A request with an ``Idempotency-Key`` it has executed before is answered from
its store without executing again (a call in doubt re-sent after a crash); one arriving while the first is
still under way waits for it. Every real execution is counted per ticket (the *logical call*) in a SQLite
file (:class:`~flink_agents_replay.testing.counter.InvocationCounter`), so "each logical call executed once"
is checked on counts kept outside the Flink worker, which a killed TaskManager cannot lose. The store of
answers is kept in the same file.

It runs in a thread of the soak's process, like the stub model service (``StubModelServer``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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
    """The state behind the HTTP handler."""

    def __init__(self, path: Path, delay_s: float):
        self.counter = InvocationCounter(path)
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.under_way: dict[str, threading.Event] = {}
        self.executions = self.replays = self.in_flight = self.without_key = 0
        self.db = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
        with self.db:
            self.db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, body TEXT NOT NULL)")

    def _stored(self, key: str) -> str | None:
        row = self.db.execute("SELECT body FROM answers WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def book(self, request: dict, key: str | None) -> str:
        while key is not None:
            with self.lock:
                stored = self._stored(key)
                if stored is not None:
                    self.replays += 1
                    return stored
                waiting = self.under_way.get(key)
                if waiting is None:
                    self.under_way[key] = threading.Event()
                    break
            waiting.wait(60)
        try:
            return self._execute(request, key)
        finally:
            if key is not None:
                with self.lock:
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

    def stats(self) -> LedgerStats:
        with self.lock:
            return LedgerStats(self.executions, self.replays, self.in_flight, self.without_key)

    def executions_per_ticket(self) -> dict[str, int]:
        return {name.split(":", 1)[1]: n for name, n in self.counter.counts().items() if name.startswith("ticket:")}


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def do_POST(self) -> None:
        if self.path != "/ledger":
            self.send_error(404)
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        body = self.server.ledger.book(request, self.headers.get("Idempotency-Key")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller is gone (a killed TaskManager); the booking stands and its key is stored


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, ledger: _Ledger):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ledger = ledger


class LedgerService:
    """The ledger on a free port of 127.0.0.1, in a thread; ``path`` is its SQLite file."""

    def __init__(self, path: Path, *, delay_ms: float = 0):
        self._ledger = _Ledger(Path(path), delay_ms / 1000)
        self._server = _HTTPServer(self._ledger)
        self._thread = threading.Thread(target=self._server.serve_forever, name="soak-ledger", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LedgerService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def stats(self) -> LedgerStats:
        return self._ledger.stats()

    def executions_per_ticket(self) -> dict[str, int]:
        """Real executions of each logical call (one booking per ticket)."""
        return self._ledger.executions_per_ticket()
