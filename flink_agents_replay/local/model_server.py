"""A local stand-in for an OpenAI-compatible model and an order-lookup tool, counting every request.

The demo and the tests must run offline, and they must count what an agent *really* asked for: the counts live
here, in a process (or thread) outside the Flink Python worker, so a worker killed and restarted cannot lose or
repeat them. The service is a Starlette application served by uvicorn; what it answers is in
:mod:`.model_replies` (``POST /v1/chat/completions`` with tools and structured output, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /orders/<id>``, ``POST /refunds`` with ``{"order_id", "amount"}``), and ``GET /stats``
gives the counters as JSON (:class:`ServerStats`; ``POST /stats/reset`` zeroes them).

Every chat and order request waits ``delay_ms`` first (a slow model), or the ``X-Stub-Delay-Ms`` header's value.
An *outage* can be scheduled (:meth:`StubModelServer.schedule_outage`, tests): once a given number of chat
completions has been executed, every chat request is answered ``503`` for a number of seconds (counted as
``unavailable``, not executed), then the service answers again.

A request carrying an ``Idempotency-Key`` header is executed at most once per key and endpoint: a later one gets
the stored reply, and one arriving while the first is still under way waits for it.

In-process (tests)::

    with StubModelServer() as server:          # port 0: any free port
        ChatModel("stub-model", base_url=server.base_url).invoke(prompt="hello")
        server.stats().chat                     # 1

As a process (the CLI, the demo): :class:`LocalModelServer`, or
``python -m flink_agents_replay.local.model_server --port 8000 --delay-ms 0``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from flink_agents_replay.local.errors import LocalServiceError

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response as HTTPResponse
    from starlette.routing import Route
except ImportError as missing:  # the dev extra's: the package itself never needs them
    raise LocalServiceError(f"the local model service needs {missing.name}, of the development extra: pip install "
                            "'flink-agents-replay[dev]'") from None
from flink_agents_replay.local.model_replies import (
    MODEL_NAME,
    MODELS,
    VERBOSE_MODEL_NAME,
    VERBOSE_SENTENCE,
    BadRequest,
    Response,
    chat_completion,
    choose_category,
    draft_reply,
    embeddings,
    error,
    json_bytes,
    order_details,
    parse_chat,
    parse_embeddings,
)
from flink_agents_replay.local.paths import home_dir
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    log_tail,
    pid_alive,
    spawn_service,
    wait_until_ready,
)

__all__ = [
    "MODEL_NAME",
    "VERBOSE_MODEL_NAME",
    "VERBOSE_SENTENCE",
    "LocalModelServer",
    "ModelServerStatus",
    "ServerStats",
    "StubModelServer",
    "choose_category",
    "default_work_dir",
    "draft_reply",
    "fetch_stats",
    "main",
    "order_details",
    "reset_stats",
]

log = logging.getLogger(__name__)

DELAY_HEADER = "X-Stub-Delay-Ms"
IDEMPOTENCY_HEADER = "Idempotency-Key"
_MAX_DELAY_MS = 600_000  # a slow model, not a request that never ends


# --- counters ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerStats:
    """What the server executed since it started (or since the last reset).

    Attributes:
        chat: chat completions executed.
        orders: order lookups executed.
        embeddings: embedding requests executed.
        refunds: refunds executed (money paid out: a refund executed twice pays twice).
        in_flight: executions under way right now (not zeroed by a reset).
        repeated: executions of a request (endpoint + canonical body or order id) executed before:
            the same question asked twice. ``Idempotency-Key`` and the delay header are not part of it.
        idempotent_replays: requests answered from the idempotency store, without executing.
        distinct: different requests executed (``executions == distinct + repeated``).
        unavailable: chat requests answered 503 during a scheduled outage (not executed).
        prompt_tokens: the ``usage.prompt_tokens`` of the chat completions executed, summed.
        completion_tokens: their ``usage.completion_tokens``, summed.
        tool_call_replies: chat completions executed that answered with tool calls.
    """

    chat: int = 0
    orders: int = 0
    embeddings: int = 0
    refunds: int = 0
    in_flight: int = 0
    repeated: int = 0
    idempotent_replays: int = 0
    distinct: int = 0
    unavailable: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_call_replies: int = 0

    @property
    def executions(self) -> int:
        """Chat completions, order lookups, embedding requests and refunds executed."""
        return self.chat + self.orders + self.embeddings + self.refunds

    def to_dict(self) -> dict[str, int]:
        """The ``GET /stats`` body."""
        return {**asdict(self), "executions": self.executions}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerStats:
        """Parse a ``GET /stats`` body (extra fields are ignored)."""
        return cls(**{f.name: int(data.get(f.name, 0)) for f in fields(cls)})


class _Slot:
    """The reply to one idempotency key: pending until ``done`` is set; ``response`` None if it failed."""

    def __init__(self) -> None:
        self.done = asyncio.Event()  # every request runs on the server's one event loop
        self.response: Response | None = None


class _State:
    """Counters and the idempotency store, shared by all request threads under one lock."""

    def __init__(self, delay_ms: float):
        self.delay_ms = delay_ms
        self._lock = threading.Lock()
        self._executions = {"chat": 0, "orders": 0, "embeddings": 0, "refunds": 0}
        self._in_flight = 0
        self._repeated = 0
        self._replays = 0
        self._seen: set[bytes] = set()
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._unavailable = 0
        self._tokens = {"prompt_tokens": 0, "completion_tokens": 0, "tool_call_replies": 0}
        self._outage: tuple[int, float] | None = None  # (after this many chat executions, for seconds)
        self._outage_ends: float | None = None

    def schedule_outage(self, after_chat: int, seconds: float) -> None:
        with self._lock:
            self._outage, self._outage_ends = (after_chat, seconds), None

    def refuse_now(self, endpoint: str) -> bool:
        """Whether a chat request falls into the scheduled outage (counted when it does)."""
        if endpoint != "chat":
            return False
        with self._lock:
            if self._outage is not None and self._outage_ends is None and self._executions["chat"] >= self._outage[0]:
                self._outage_ends = time.monotonic() + self._outage[1]
            if self._outage_ends is not None and time.monotonic() < self._outage_ends:
                self._unavailable += 1
                return True
            return False

    def stats(self) -> ServerStats:
        with self._lock:
            return ServerStats(chat=self._executions["chat"], orders=self._executions["orders"],
                               embeddings=self._executions["embeddings"], refunds=self._executions["refunds"],
                               in_flight=self._in_flight, repeated=self._repeated,
                               idempotent_replays=self._replays, distinct=len(self._seen),
                               unavailable=self._unavailable, **self._tokens)

    def reset(self) -> None:
        with self._lock:
            self._executions = dict.fromkeys(self._executions, 0)
            self._tokens = dict.fromkeys(self._tokens, 0)
            self._repeated = self._replays = self._unavailable = 0
            self._seen.clear()
            # Pending requests keep their own slot and still answer whoever waits on it.
            self._slots.clear()

    async def run(self, endpoint: str, canonical: str, key: str | None, delay_s: float,
                  produce: Callable[[], Response]) -> Response:
        """Execute a request, or replay the stored reply to its idempotency key."""
        if key is None:
            return await self._execute(endpoint, canonical, delay_s, produce)
        slot_key = (endpoint, key)
        while True:
            with self._lock:
                slot = self._slots.get(slot_key)
                owner = slot is None
                if owner:
                    slot = self._slots[slot_key] = _Slot()
            if owner:
                break
            await slot.done.wait()
            if slot.response is not None:
                with self._lock:
                    self._replays += 1
                return slot.response
            # The first attempt ended without a reply (and left the store): this request takes over.
        try:
            slot.response = await self._execute(endpoint, canonical, delay_s, produce)
            return slot.response
        finally:
            if slot.response is None:
                with self._lock:
                    if self._slots.get(slot_key) is slot:
                        del self._slots[slot_key]
            slot.done.set()

    async def _execute(self, endpoint: str, canonical: str, delay_s: float,
                       produce: Callable[[], Response]) -> Response:
        digest = hashlib.sha256(f"{endpoint}\0{canonical}".encode()).digest()
        with self._lock:
            self._executions[endpoint] += 1
            self._in_flight += 1
            if digest in self._seen:
                self._repeated += 1
            else:
                self._seen.add(digest)
        response = None
        try:
            if delay_s > 0:
                await asyncio.sleep(delay_s)  # the simulated model at work
            response = produce()
            return response
        finally:
            with self._lock:
                self._in_flight -= 1
                if response is not None:
                    self._tokens["prompt_tokens"] += response.prompt_tokens
                    self._tokens["completion_tokens"] += response.completion_tokens
                    self._tokens["tool_call_replies"] += response.tool_calls


# --- HTTP ---------------------------------------------------------------------------------------------------


def _reply(response: Response) -> HTTPResponse:
    return HTTPResponse(response.body, status_code=response.status, media_type="application/json")


def _application(state: _State) -> Starlette:
    """The service's routes over ``state``; unknown routes and methods answer in OpenAI's error format."""
    app = Starlette(routes=[
        Route("/v1/models", _models, methods=["GET"]),
        Route("/stats", _stats, methods=["GET"]),
        Route("/stats/reset", _stats, methods=["POST"]),
        Route("/orders", _order, methods=["GET"]),
        Route("/orders/{order_id:path}", _order, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/embeddings", _embedding, methods=["POST"]),
        Route("/refunds", _refund, methods=["POST"]),
    ], exception_handlers={HTTPException: _no_route})
    app.state.counters = state
    return app


def _state(request: Request) -> _State:
    return request.app.state.counters


async def _models(request: Request) -> HTTPResponse:
    return _reply(MODELS)


async def _stats(request: Request) -> HTTPResponse:
    if request.method == "POST":
        _state(request).reset()
    return _reply(Response(200, json_bytes(_state(request).stats().to_dict())))


async def _order(request: Request) -> HTTPResponse:
    order_id = request.path_params.get("order_id", "")
    if not order_id:
        return _reply(error(404, "no order id: GET /orders/<order_id>"))
    return await _executed(request, "orders", order_id, lambda: Response(200, json_bytes(order_details(order_id))))


async def _chat(request: Request) -> HTTPResponse:
    raw = await _body(request)
    if raw is None:
        return _reply(error(400, "the request's body did not arrive"))  # not sent: its caller is gone
    try:
        parsed = parse_chat(raw)
        canonical = json_bytes(parsed).decode()
        # A pure function of the request: made now, so that a bad tool or schema is a 400, not executed.
        reply = chat_completion(parsed, canonical)
    except BadRequest as exc:
        return _reply(error(400, str(exc)))
    return await _executed(request, "chat", canonical, lambda: reply)


async def _embedding(request: Request) -> HTTPResponse:
    raw = await _body(request)
    if raw is None:
        return _reply(error(400, "the request's body did not arrive"))  # not sent: its caller is gone
    try:
        texts, dimensions, model, as_base64 = parse_embeddings(raw)
    except BadRequest as exc:
        return _reply(error(400, str(exc)))
    return await _executed(request, "embeddings", json_bytes([texts, dimensions, as_base64]).decode(),
                           lambda: embeddings(texts, dimensions, model, as_base64), delayed=False)


async def _refund(request: Request) -> HTTPResponse:
    raw = await _body(request)
    if raw is None:
        return _reply(error(400, "the request's body did not arrive"))  # not sent: its caller is gone
    try:
        body = json.loads(raw)
        order_id, amount = body["order_id"], float(body["amount"])
    except (ValueError, TypeError, KeyError):
        return _reply(error(400, 'a refund is {"order_id": "...", "amount": <number>}'))
    refund = {"refund_id": f"R-{order_id}", "order_id": order_id, "amount": amount, "status": "refunded"}
    return await _executed(request, "refunds", json_bytes([order_id, amount]).decode(),
                           lambda: Response(200, json_bytes(refund)), delayed=False)


async def _no_route(request: Request, exc: Exception) -> HTTPResponse:
    reply = _reply(error(getattr(exc, "status_code", 404), f"no route {request.method} {request.url.path}"))
    reply.headers.update(getattr(exc, "headers", None) or {})  # a 405's Allow
    return reply


async def _body(request: Request) -> bytes | None:
    """The request's body, or ``None`` if its caller went away while sending it (a killed TaskManager): one log
    line, not the server's traceback."""
    try:
        return await request.body()
    except ClientDisconnect:
        log.info("the client of %s %s went away before its request arrived", request.method, request.url.path)
        return None


async def _executed(request: Request, endpoint: str, canonical: str, produce: Callable[[], Response], *,
                    delayed: bool = True) -> HTTPResponse:
    """Execute the request (or replay it by its idempotency key), after its delay; a chat request during an
    outage is a 503. A caller gone before its reply (a killed TaskManager) is one log line."""
    state = _state(request)
    header = request.headers.get(DELAY_HEADER)
    try:
        delay_ms = float(header) if header is not None and delayed else state.delay_ms
        if header is not None and delayed and not 0 <= delay_ms <= _MAX_DELAY_MS:
            raise ValueError
    except ValueError:
        return _reply(error(400, f"{DELAY_HEADER} must be a number of milliseconds from 0 to {_MAX_DELAY_MS}, "
                                 f"got {header!r}"))
    if state.refuse_now(endpoint):
        return _reply(error(503, "the model is unavailable (a scheduled outage)"))
    key = request.headers.get(IDEMPOTENCY_HEADER) or None
    try:
        response = await state.run(endpoint, canonical, key, delay_ms / 1000 if delayed else 0.0, produce)
    except asyncio.CancelledError:  # the server stopped with the request under way: abandoned, its caller cut off
        log.info("%s %s abandoned: the server stopped", request.method, request.url.path)
        return _reply(error(503, "the service stopped"))  # not sent: its connection is closed already
    if await request.is_disconnected():
        log.info("the client of %s %s went away before its reply", request.method, request.url.path)
    return _reply(response)


class StubModelServer:
    """The stub service on a background thread of this process (uvicorn with its own event loop).

    Args:
        port: port on ``host``; ``0`` picks a free one (read it back from :attr:`port`).
        delay_ms: wait before executing each chat or order request (``X-Stub-Delay-Ms`` overrides it).
        host: address to listen on.
    """

    def __init__(self, port: int = 0, delay_ms: float = 0, *, host: str = "127.0.0.1"):
        if not 0 <= delay_ms <= _MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be a number of milliseconds from 0 to {_MAX_DELAY_MS}, got {delay_ms}")
        self.host = host
        self._requested_port = port
        self._state = _State(delay_ms)
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> StubModelServer:
        """Listen, and serve on a daemon thread; returns ``self``. A taken port raises :class:`LocalServiceError`."""
        if self._server is not None:
            return self
        self._socket = _listening_socket(self.host, self._requested_port)
        # No access log (one line per request would drown the demo's output); no signal handlers (a thread).
        config = uvicorn.Config(_application(self._state), log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=0, backlog=1024)
        self._server = uvicorn.Server(config)
        loop_running = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(loop_running),),
                                        name="stub-model-server", daemon=True)
        self._thread.start()
        loop_running.wait()
        return self

    async def _serve(self, loop_running: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        loop_running.set()
        await self._server.serve(sockets=[self._socket])

    def stop(self) -> None:
        """Stop serving and close the socket; requests under way are abandoned (their callers' connections are
        cut, as when a real service goes down)."""
        if self._server is None:
            return
        self._loop.call_soon_threadsafe(self._abandon_requests)
        if self._thread is not None:
            self._thread.join()
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = self._loop = None

    def _abandon_requests(self) -> None:
        """On the server's loop: cut every open connection, then end the server without waiting for requests."""
        for connection in list(self._server.server_state.connections):
            connection.transport.abort()
        self._server.should_exit = self._server.force_exit = True

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        if self._socket is None:
            raise RuntimeError("the stub model server is not started: call start() first")
        return self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        """Root URL: ``http://127.0.0.1:PORT`` (``/orders/...``, ``/stats``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI API root for clients (``OPENAI_BASE_URL``): ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def stats(self) -> ServerStats:
        """The counters now."""
        return self._state.stats()

    def reset_stats(self) -> None:
        """Zero the counters and forget stored idempotent replies (like ``POST /stats/reset``)."""
        self._state.reset()

    def schedule_outage(self, *, after_chat: int, seconds: float) -> None:
        """Once ``after_chat`` chat completions were executed, answer every chat request 503 for ``seconds``."""
        self._state.schedule_outage(after_chat, seconds)

    def __enter__(self) -> StubModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` before the server's loop runs, so clients can connect at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)  # a job opens dozens of connections at once
    except OSError as exc:
        sock.close()
        raise LocalServiceError(
            f"cannot listen on {host}:{port} ({exc.strerror}): stop what listens there, or choose another port "
            "(--port N, or --port 0 for any free port)") from None
    return sock


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[:-len("/v1")] if url.endswith("/v1") else url


def fetch_stats(url: str, timeout_s: float = 10.0) -> ServerStats:
    """``GET /stats`` of a running server; ``url`` is its root or its ``/v1`` base URL."""
    with urllib.request.urlopen(_root(url) + "/stats", timeout=timeout_s) as response:
        return ServerStats.from_dict(json.loads(response.read()))


def reset_stats(url: str, timeout_s: float = 10.0) -> ServerStats:
    """``POST /stats/reset`` of a running server; returns the counters after the reset."""
    request = urllib.request.Request(_root(url) + "/stats/reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return ServerStats.from_dict(json.loads(response.read()))


# --- as a process -------------------------------------------------------------------------------------------


def default_work_dir() -> Path:
    """Work directory of the model server the CLI manages."""
    return home_dir() / "model-server"


@dataclass(frozen=True)
class ModelServerStatus:
    """What a work directory says about its model server."""

    running: bool
    pid: int | None
    port: int | None
    work_dir: Path

    @property
    def url(self) -> str | None:
        """Root URL, or None when not running."""
        return f"http://127.0.0.1:{self.port}" if self.running else None

    @property
    def base_url(self) -> str | None:
        """OpenAI API root (``OPENAI_BASE_URL``), or None when not running."""
        return f"{self.url}/v1" if self.running else None

    def describe(self) -> str:
        """One line for people."""
        if self.running:
            return f"running: pid {self.pid}, OpenAI base URL {self.base_url}, log in {self.work_dir}"
        return f"not running (work directory {self.work_dir})"


class LocalModelServer(RecordedProcess):
    """The stub service as a detached process whose state (PID, port, log) lives in ``work_dir``.

    Args:
        work_dir: directory for the log and the state file; created if missing.
        port: port on 127.0.0.1; ``0`` picks a free one.
        delay_ms: wait before executing each chat or order request.
        start_timeout_s: how long ``start`` waits for the server to answer.
    """

    def __init__(self, work_dir: Path | str | None = None, *, port: int = 8000, delay_ms: float = 0,
                 start_timeout_s: float = 30.0):
        self.work_dir = Path(work_dir) if work_dir is not None else default_work_dir()
        self.port = port
        self.delay_ms = delay_ms
        self.start_timeout_s = start_timeout_s

    @property
    def _state_file(self) -> Path:
        return self.work_dir / "model-server.json"

    @property
    def log_file(self) -> Path:
        """The server's stdout and stderr."""
        return self.work_dir / "model-server.log"

    def status(self) -> ModelServerStatus:
        """Read the state file and check that its PID still runs."""
        state = self._read_state()
        if state and pid_alive(state["pid"]):
            return ModelServerStatus(True, state["pid"], state["port"], self.work_dir)
        return ModelServerStatus(False, None, None, self.work_dir)

    def start(self) -> ModelServerStatus:
        """Start the server (or return the one already running here) and wait until it answers."""
        current = self.status()
        if current.running:
            return current
        port = claim_port(self.port)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # The child imports this very package, even from a checkout that is not installed.
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        with open(self.log_file, "ab") as out:
            process = spawn_service(
                [sys.executable, "-m", "flink_agents_replay.local.model_server",
                 "--port", str(port), "--delay-ms", str(self.delay_ms)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=self.work_dir,  # outlives the CLI; stopped by PID
            )
        self._state_file.write_text(json.dumps({"pid": process.pid, "port": port}))
        try:
            self._wait_until_ready(process, port)
        except BaseException:
            self.stop()
            raise
        return ModelServerStatus(True, process.pid, port, self.work_dir)

    def _wait_until_ready(self, process: subprocess.Popen, port: int) -> None:
        url = f"http://127.0.0.1:{port}/v1/models"

        def answers() -> bool:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200

        wait_until_ready(process, answers, what="the model server", where=url, timeout_s=self.start_timeout_s,
                         log_tail=self._log_tail, interval_s=0.05)

    def _log_tail(self) -> str:
        return log_tail(self.log_file)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM or SIGINT; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m flink_agents_replay.local.model_server",
                                     description="OpenAI-compatible stub model and order-lookup service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (default 8000)")
    parser.add_argument("--delay-ms", type=float, default=0, help="wait before each chat or order request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="stub model server: %(message)s")
    # SIGTERM (from `stop`) ends it like Ctrl-C: a KeyboardInterrupt in the main thread.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with StubModelServer(args.port, args.delay_ms, host=args.host) as server:
            print(f"stub model server: OpenAI base URL {server.base_url}, delay {args.delay_ms:g} ms", flush=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    except (LocalServiceError, ValueError) as exc:
        print(f"model server: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
