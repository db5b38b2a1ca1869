"""A client of MCP servers (the official ``mcp`` SDK) for synchronous code: one session per server and process.

An MCP tool's call runs on a task thread of a TaskManager's Python worker, which is synchronous. Each process
keeps one :class:`SessionPool` (:func:`session_pool`): a background thread runs an asyncio event loop, and on it
one SDK ``ClientSession`` per server (:class:`McpServer`), opened on first use, shared by every thread of the
process and every tool of that server. Calls wait for their result on the calling thread.

Transports:

* **stdio** (``McpServer(command=..., args=..., env=..., cwd=...)``): the client starts the server process, as
  the SDK does, and talks to it over its stdin and stdout. So *each Python process that uses the server starts
  its own copy*: every TaskManager Python worker, and the job's client process while it lists the tools. The
  server's stderr goes to a temporary file (the tail of which is put into the error when the server fails to
  start), or to ``McpServer(stderr=path)``: never to the worker's own stderr, which nobody may read.
* **streamable HTTP** (``McpServer(url=...)``): the server is started by whoever runs it; every process
  connects to the same one.

Failures:

* A *transport failure* (the server cannot be started or reached, the connection or the session broke, the server
  restarted and no longer knows the session) closes the session; the call is tried again on a new session, up to
  :data:`ATTEMPTS` (4) times in all, waiting 0.2 s, 0.4 s, then 0.8 s between attempts (exponential from
  :data:`BACKOFF_MIN_S`, at most :data:`BACKOFF_MAX_S`), then
  :class:`~flink_agents_replay.core.errors.McpConnectionError` is raised, or, when a request had gone out,
  :class:`~flink_agents_replay.core.errors.McpCallInDoubtError` (a ``CallTimeoutError``: the call is in doubt, never
  a failure made again under a new call id). A request that was sent before the failure may have reached the
  server: every attempt carries the same idempotency key in its ``_meta`` (:data:`IDEMPOTENCY_META_KEY`), which a
  server that honours it uses to act once. A call waiting on an HTTP session pings it every
  :data:`PING_EVERY_S` (2) seconds: a server that died during the call is noticed though its answer's stream
  stays open.
* A tool result with ``isError: true`` raises :class:`~flink_agents_replay.core.errors.McpToolError` with the
  result's text; a JSON-RPC error from the server (an unknown tool, invalid arguments) raises
  :class:`~flink_agents_replay.core.errors.McpProtocolError` with its code and message. Neither is retried.
* A call that does not answer within its ``timeout_s`` raises
  :class:`~flink_agents_replay.core.errors.CallTimeoutError` (not retried: it may still take effect).

The ``mcp`` package is the optional extra ``flink-agents-replay[mcp]``, imported on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import tenacity

from flink_agents_replay.core.errors import (
    CallTimeoutError,
    ConfigError,
    McpCallInDoubtError,
    McpConnectionError,
    McpProtocolError,
    McpToolError,
)

__all__ = ["ATTEMPTS", "BACKOFF_MAX_S", "BACKOFF_MIN_S", "IDEMPOTENCY_META_KEY", "INSTALL_HINT", "McpServer",
           "SessionPool", "list_tools", "result_value", "session_pool"]

_log = logging.getLogger(__name__)

#: The key of the call id in a ``tools/call`` request's ``_meta`` (the MCP spec reserves ``_meta`` for such data).
IDEMPOTENCY_META_KEY = "idempotency_key"
#: Attempts of a call (or of a listing) when the transport fails, and the waits between them.
ATTEMPTS = 4
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 2.0
#: While a call waits for its answer on an HTTP session, the session is pinged this often (seconds).
PING_EVERY_S = 2.0
#: How to get the SDK.
INSTALL_HINT = "pip install 'flink-agents-replay[mcp]'"

_SDK_IMPORT = threading.Lock()  # two threads importing the SDK at once can deadlock on module locks
_STDERR_TAIL = 2000


def _sdk() -> Any:
    """The ``mcp`` package, imported on first use (the optional extra)."""
    with _SDK_IMPORT:
        try:
            import mcp
            import mcp.client.stdio
            import mcp.client.streamable_http
            import mcp.shared.exceptions
            import mcp.types
        except ImportError as exc:
            raise ImportError(f"MCP tools need the mcp package ({exc}): {INSTALL_HINT}") from exc
        return mcp


@dataclass(frozen=True)
class McpServer:
    """Where an MCP server is: a command the client starts (stdio), or a URL (streamable HTTP). Give one.

    Args:
        command: the executable that starts the server (stdio), found on ``PATH``.
        args: its arguments.
        env: variables set for the server, on top of the few the SDK passes on (``HOME``, ``PATH``, ``USER``...);
            the process's own environment is not inherited.
        cwd: the server's working directory.
        stderr: a file the server's stderr is appended to (default: a temporary file, deleted with the session).
        url: the server's streamable HTTP endpoint, like ``http://127.0.0.1:8000/mcp``.
        headers: HTTP headers sent with every request (authorization...).
        connect_timeout_s: how long starting or connecting, and the initialize handshake, may take per attempt.

    The config travels with the tools to the TaskManagers (pickled), ``env`` and ``headers`` included. Their
    values (secrets, often) are left out of :meth:`identity`, which only names them.
    """

    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    stderr: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    connect_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError("McpServer takes either command= (a server the client starts, over stdio) or url= "
                              f"(a streamable HTTP endpoint), not {'both' if self.command else 'neither'}")
        if self.command is not None:
            self._check_stdio()
        else:
            self._check_http()
        if not isinstance(self.connect_timeout_s, (int, float)) or not 0 < self.connect_timeout_s < float("inf"):
            raise ConfigError(f"McpServer connect_timeout_s must be a positive number of seconds, got "
                              f"{self.connect_timeout_s!r}")

    def _check_stdio(self) -> None:
        if not isinstance(self.command, str) or not self.command.strip():
            raise ConfigError(f"McpServer command= must be the executable to start, got {self.command!r}")
        if isinstance(self.args, str) or not all(isinstance(arg, str) for arg in self.args):
            raise ConfigError(f"McpServer args= must be a list of strings, got {self.args!r}")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", _pairs("env", self.env))
        for name, value in (("cwd", self.cwd), ("stderr", self.stderr)):
            if value is not None:
                object.__setattr__(self, name, os.fspath(value))
        if self.headers is not None:
            raise ConfigError("McpServer headers= go with url=: a stdio server takes env= instead")

    def _check_http(self) -> None:
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"McpServer url= must be an http(s) URL of the server's MCP endpoint, like "
                              f"http://127.0.0.1:8000/mcp, got {self.url!r}")
        given = [name for name in ("env", "cwd", "stderr") if getattr(self, name) is not None] + (
            ["args"] if self.args else [])
        if given:
            raise ConfigError(f"McpServer {', '.join(given)} go with command= (a server the client starts); a "
                              "server at a URL is started by whoever runs it")
        object.__setattr__(self, "args", ())
        object.__setattr__(self, "headers", _pairs("headers", self.headers))

    @property
    def transport(self) -> str:
        """``stdio`` or ``streamable-http``."""
        return "stdio" if self.command is not None else "streamable-http"

    def identity(self) -> dict[str, Any]:
        """What the server is, as plain data without secrets: the command and arguments (and working directory)
        of a stdio server with the *names* of its variables; the URL of an HTTP one with its headers' names."""
        if self.command is not None:
            return {"transport": self.transport, "command": self.command, "args": list(self.args), "cwd": self.cwd,
                    "env": sorted(name for name, _ in self.env or ())}
        return {"transport": self.transport, "url": self.url, "headers": sorted(name for name, _ in self.headers or ())}

    def describe(self) -> str:
        """The server, for messages."""
        if self.command is not None:
            return f"the MCP server {' '.join([self.command, *self.args])!r} (stdio)"
        return f"the MCP server at {self.url}"


def _pairs(what: str, mapping: Any) -> tuple[tuple[str, str], ...] | None:
    """A mapping of strings, kept as sorted pairs (hashable: the config is the pool's key)."""
    if mapping is None:
        return None
    items = mapping if isinstance(mapping, tuple) else tuple(mapping.items()) if isinstance(mapping, Mapping) else None
    if items is None or not all(isinstance(k, str) and isinstance(v, str) for k, v in items):
        raise ConfigError(f"McpServer {what}= must map strings to strings, got {mapping!r}")
    return tuple(sorted(items))


class _TransportFailure(Exception):
    """A transport failure of one attempt (retried). ``sent``: the request had gone out, so it may have acted."""

    def __init__(self, message: str, *, sent: bool = False):
        super().__init__(message)
        self.sent = sent


def result_value(result: Any, tool: str, server: McpServer) -> Any:
    """What a call returns of a ``CallToolResult``: its ``structuredContent`` when present (a dict), else the
    text of its content joined with newlines (text blocks, and embedded text resources; images, audio and links
    are left out; ``""`` when there is none). An ``isError`` result raises
    :class:`~flink_agents_replay.core.errors.McpToolError` with that text."""
    texts = []
    for block in result.content or ():
        text = getattr(block, "text", None)
        resource = getattr(block, "resource", None)
        if text is None and resource is not None:
            text = getattr(resource, "text", None)
        if isinstance(text, str):
            texts.append(text)
    text = "\n".join(texts)
    if result.isError:
        raise McpToolError(tool, text or "(no text)", server.describe())
    if result.structuredContent is not None:
        return result.structuredContent
    return text


def _listing(tool: Any) -> dict[str, Any]:
    """A listed tool as plain data (the MCP field names)."""
    annotations = tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else {}
    return {"name": tool.name, "title": getattr(tool, "title", None), "description": tool.description,
            "inputSchema": dict(tool.inputSchema), "outputSchema": getattr(tool, "outputSchema", None),
            "annotations": annotations}


class _Connection:
    """One session with one server, owned by one task on the pool's loop (the SDK's contexts are entered and left
    there). ``dead`` is set when the session ends for any reason; calls under way then fail as transport
    failures."""

    def __init__(self, server: McpServer):
        self.server = server
        self.session: Any = None
        self.dead = asyncio.Event()
        self.error = ""
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stderr: Any = None

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.dead.is_set() and not self._stop.is_set()  # not closing

    async def open(self) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())  # read, whoever waits or not
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-session {self.server.describe()}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except asyncio.TimeoutError:
            self._task.cancel()  # stuck starting or in the handshake: no stop event reaches it there
            raise _TransportFailure(f"no session within {self.server.connect_timeout_s} s (connect_timeout_s)"
                                    f"{self._stderr_tail()}") from None

    def close(self) -> None:
        self._stop.set()

    async def closed(self) -> None:
        self.close()
        if self._task is not None and self.session is None:  # not past the handshake: only a cancel ends it
            self._task.cancel()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task

    def _transport(self) -> Any:
        mcp = _sdk()
        if self.server.command is not None:
            if self.server.stderr is not None:
                self._stderr = open(self.server.stderr, "a", encoding="utf-8")  # noqa: SIM115 - closed with the session
            else:
                self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            parameters = mcp.client.stdio.StdioServerParameters(
                command=self.server.command, args=list(self.server.args),
                env=dict(self.server.env) if self.server.env is not None else None, cwd=self.server.cwd)
            return mcp.client.stdio.stdio_client(parameters, errlog=self._stderr)
        http = mcp.client.streamable_http
        headers = dict(self.server.headers or ())
        if not hasattr(http, "streamable_http_client"):  # older SDKs (deprecated in newer ones)
            return http.streamablehttp_client(self.server.url, headers=headers or None)
        if not headers:
            return http.streamable_http_client(self.server.url)
        from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's default client, with headers

        client = create_mcp_http_client(headers=headers)
        return _closing_client(http.streamable_http_client(self.server.url, http_client=client), client)

    async def _own(self, ready: asyncio.Future) -> None:
        import anyio

        mcp = _sdk()
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                read, write = streams[0], streams[1]
                for stream in (read, write):  # ours to close once the session is done with them
                    stack.push_async_callback(stream.aclose)
                to_session, session_read = anyio.create_memory_object_stream(0)
                await stack.enter_async_context(to_session)
                await stack.enter_async_context(session_read)
                session = await stack.enter_async_context(mcp.ClientSession(session_read, write))
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._pump, read, to_session)
                    await session.initialize()
                    self.session = session
                    ready.set_result(None)
                    await self._stop.wait()
                    tasks.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 - the session ended: calls under way learn it from `dead`
            self.error = _describe(exc)
        finally:
            self.error = self.error or "the session was closed"
            self.dead.set()
            self._stop.set()
            if not ready.done():  # the server's last words, read now that it has exited
                ready.set_exception(_TransportFailure(f"{self.error}{self._stderr_tail()}"))
            if self._stderr is not None:
                with contextlib.suppress(OSError):
                    self._stderr.close()

    async def _pump(self, read: Any, to_session: Any) -> None:
        """Hands the transport's messages to the session; the transport's end (the server exited, the stream
        broke) ends the session."""
        try:
            async with to_session:
                async for message in read:
                    await to_session.send(message)
            self.error = "the server closed the connection"
        except Exception as exc:  # noqa: BLE001 - any end of the transport ends the session
            self.error = _describe(exc)
        finally:
            self.dead.set()
            self._stop.set()

    def _stderr_tail(self) -> str:
        if self._stderr is None or self.server.stderr is not None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            tail = self._stderr.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""
        return f"; the server's stderr ends: {tail}" if tail else ""



@contextlib.asynccontextmanager
async def _closing_client(transport: Any, client: Any) -> Any:
    """The streamable HTTP transport with the httpx client given to it, closed after it."""
    async with client:
        async with transport as streams:
            yield streams


def _describe(exc: BaseException) -> str:
    """An exception (an exception group's first leaf) as ``Type: message``."""
    while isinstance(getattr(exc, "exceptions", None), (list, tuple)) and exc.exceptions:  # an exception group
        exc = exc.exceptions[0]
    if isinstance(exc, asyncio.CancelledError):
        return "the session was closed"
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


def _is_transport_error(exc: BaseException) -> bool:
    """Whether an error raised by a request means the connection or the session is gone."""
    mcp = _sdk()
    if isinstance(exc, mcp.shared.exceptions.McpError):
        code, message = exc.error.code, exc.error.message or ""
        # CONNECTION_CLOSED; the streamable HTTP client's answer to a 404 (a restarted server's unknown session).
        return code == mcp.types.CONNECTION_CLOSED or (code in (32600, -32600) and "session terminated" in
                                                         message.lower())
    import anyio
    import httpx

    return isinstance(exc, (OSError, httpx.TransportError, anyio.ClosedResourceError, anyio.BrokenResourceError,
                            anyio.EndOfStream))


async def _answer_or_end(connection: _Connection, call: asyncio.Future, timeout_s: float | None) -> set:
    """What came first: the call's answer (``{call}``), the session's end (``{ended}``), or neither within
    ``timeout_s`` (``set()``). An HTTP session is pinged every :data:`PING_EVERY_S` while it waits: a server that
    died during the call may leave its answer's stream open with nothing to come (the SDK does not notice), and a
    failed ping ends the session, so the call is tried again, under its key, on a new one."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    ended = asyncio.ensure_future(connection.dead.wait())
    try:
        while True:
            left = None if deadline is None else max(deadline - loop.time(), 0.0)
            wait = left if connection.server.url is None else min(PING_EVERY_S, left if left is not None else
                                                                  PING_EVERY_S)
            done, _ = await asyncio.wait({call, ended}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if done:
                return {call} if call in done else {ended}
            if deadline is not None and loop.time() >= deadline:
                return set()
            if not await _answers_ping(connection):
                connection.error = connection.error or "the server did not answer a ping during the call"
                connection.close()
                return {ended}
    finally:
        ended.cancel()


async def _answers_ping(connection: _Connection) -> bool:
    """Whether the session is still there: a ping that fails says it is not; one not answered in time says
    nothing (a server busy with a tool that blocks its loop answers late), so the call waits on."""
    try:
        await asyncio.wait_for(connection.session.send_ping(), PING_EVERY_S)
    except asyncio.TimeoutError:
        return True
    except Exception:  # noqa: BLE001 - refused, unknown session (a restarted server): the session is gone
        return False
    return True


class SessionPool:
    """The sessions of one process, one per server config, on one event loop thread (see the module docstring)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-sessions", daemon=True)
        self._thread.start()
        self._connections: dict[McpServer, _Connection] = {}
        self._locks: dict[McpServer, asyncio.Lock] = {}
        self._retiring: set[asyncio.Future] = set()
        self._closed = False

    def _run(self, coroutine: Any) -> Any:
        if self._closed:
            coroutine.close()
            raise McpConnectionError("the process's MCP sessions are closed (the process is exiting)")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _retrying(self, server: McpServer, what: str, attempt: Any, *, resend: bool = True) -> Any:
        """``attempt()`` (a coroutine function), tried :data:`ATTEMPTS` times while the transport fails. A request that
        went out is sent again only with ``resend`` (the caller's in-doubt policy would make it again, under the same
        key, anyway); else its failure is at once :class:`McpCallInDoubtError`, for that policy to decide."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=BACKOFF_MIN_S, min=BACKOFF_MIN_S, max=BACKOFF_MAX_S),
            retry=tenacity.retry_if_exception_type(_TransportFailure), reraise=True,
            before_sleep=lambda state: _log.warning("%s of %s failed (attempt %d of %d), trying again: %s", what,
                                                    server.describe(), state.attempt_number, ATTEMPTS,
                                                    state.outcome.exception()))
        sent = False
        try:
            for step in retrying:
                with step:
                    try:
                        return self._run(attempt())
                    except _TransportFailure as failure:
                        sent = sent or failure.sent
                        if sent and not resend:
                            raise McpCallInDoubtError(f"{what} of {server.describe()} failed after it was sent "
                                                      f"({failure}); it may have taken effect") from None
                        raise
        except _TransportFailure as exc:
            message = (f"{what} of {server.describe()} failed {ATTEMPTS} times (waiting {BACKOFF_MIN_S} s to "
                       f"{BACKOFF_MAX_S} s between attempts); last: {exc}")
            if sent:  # a request that went out may have acted: in doubt, never a failure made again under a new id
                raise McpCallInDoubtError(f"{message}; it was sent and may have taken effect") from None
            raise McpConnectionError(message) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self, server: McpServer) -> _Connection:
        connection = self._connections.get(server)
        if connection is not None and connection.alive:
            return connection
        lock = self._locks.setdefault(server, asyncio.Lock())
        async with lock:
            connection = self._connections.get(server)
            if connection is None or not connection.alive:
                if connection is not None:
                    self._retire(connection)
                connection = _Connection(server)
                try:
                    await connection.open()
                except BaseException:
                    self._retire(connection)
                    raise
                self._connections[server] = connection
        return connection

    def _retire(self, connection: _Connection) -> None:
        connection.close()
        closing = asyncio.ensure_future(connection.closed())
        self._retiring.add(closing)  # held until done: the loop keeps only weak references to tasks
        closing.add_done_callback(self._retiring.discard)

    def call_tool(self, server: McpServer, tool: str, arguments: Mapping[str, Any], *,
                  idempotency_key: str | None = None, timeout_s: float | None = None, resend: bool = True) -> Any:
        """Call ``tool`` with ``arguments`` on the server's session and return what :func:`result_value` makes of
        its result. The idempotency key goes in the request's ``_meta`` under :data:`IDEMPOTENCY_META_KEY`.
        ``resend``: a request that went out and got no answer may be sent again (see :meth:`_retrying`)."""
        meta = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key is not None else None

        async def attempt() -> Any:
            return await self._call_once(server, tool, dict(arguments), meta, timeout_s)

        return result_value(self._retrying(server, f"the call of {tool!r}", attempt, resend=resend), tool, server)

    async def _call_once(self, server: McpServer, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None,
                         timeout_s: float | None) -> Any:
        connection = await self._connection(server)
        call = asyncio.ensure_future(connection.session.call_tool(tool, arguments, meta=meta))
        done = await _answer_or_end(connection, call, timeout_s)
        if call not in done:
            call.cancel()
            if not done:
                raise CallTimeoutError(f"the MCP tool {tool!r} of {server.describe()} did not answer within "
                                       f"{timeout_s} s; it may still take effect")
            raise _TransportFailure(f"the session ended during the call: {connection.error}", sent=True)
        try:
            return call.result()
        except Exception as exc:
            if _is_transport_error(exc):
                connection.error = connection.error or _describe(exc)
                connection.close()
                raise _TransportFailure(_describe(exc), sent=True) from None
            mcp = _sdk()
            if isinstance(exc, mcp.shared.exceptions.McpError):
                raise McpProtocolError(tool, exc.error.message, exc.error.code, server.describe()) from None
            if type(exc) is RuntimeError:  # the SDK's check of structured content against the output schema
                raise McpProtocolError(tool, str(exc), None, server.describe()) from None
            raise

    def list_tools(self, server: McpServer) -> list[dict[str, Any]]:
        """The server's tools (every page), each as plain data: ``name``, ``title``, ``description``,
        ``inputSchema``, ``outputSchema`` and ``annotations`` (the fields the server set)."""

        async def attempt() -> list[dict[str, Any]]:
            connection = await self._connection(server)
            listed, cursor = [], None
            while True:
                try:
                    listing = connection.session.list_tools(cursor) if cursor else connection.session.list_tools()
                    page = await asyncio.wait_for(listing, server.connect_timeout_s)
                except asyncio.TimeoutError:
                    connection.close()
                    raise _TransportFailure(f"no answer to tools/list within {server.connect_timeout_s} s "
                                            "(connect_timeout_s)") from None
                except Exception as exc:
                    if _is_transport_error(exc):
                        connection.close()
                        raise _TransportFailure(_describe(exc)) from None
                    raise McpProtocolError("tools/list", str(exc), getattr(getattr(exc, "error", None), "code", None),
                                           server.describe()) from None
                listed.extend(_listing(tool) for tool in page.tools)
                cursor = page.nextCursor
                if not cursor:
                    return listed

        return self._retrying(server, "listing the tools", attempt)

    def has_session(self, server: McpServer) -> bool:
        """Whether a session with ``server`` is open."""
        connection = self._connections.get(server)
        return connection is not None and connection.alive

    def close_session(self, server: McpServer) -> None:
        """Ends the session with ``server`` (a stdio server's process exits); the next call opens a new one."""
        async def close() -> None:
            connection = self._connections.pop(server, None)
            if connection is not None:
                await connection.closed()

        if not self._closed:
            self._run(close())

    def close_sessions(self) -> None:
        """Ends every session (stdio servers exit); calls after it open new ones."""
        async def close_all() -> None:
            connections = list(self._connections.values())
            self._connections.clear()
            await asyncio.gather(*(connection.closed() for connection in connections), *self._retiring,
                                 return_exceptions=True)
            self._retiring.clear()

        if not self._closed:
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout=30)

    def close(self) -> None:
        """Ends every session and stops the loop (at exit)."""
        if self._closed:
            return
        try:
            self.close_sessions()
        except Exception:  # noqa: BLE001 - at exit: a server that does not stop is the OS's to end
            _log.debug("closing MCP sessions", exc_info=True)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


_POOL: tuple[int, SessionPool] | None = None
_POOL_LOCK = threading.Lock()


def session_pool() -> SessionPool:
    """This process's pool (a forked child makes its own)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _sdk()  # imported here, once, before the loop thread needs it
            pool = SessionPool()
            _POOL = (os.getpid(), pool)
            atexit.register(pool.close)
        return _POOL[1]


def list_tools(server: McpServer) -> list[dict[str, Any]]:
    """The server's tools as plain data (:meth:`SessionPool.list_tools`). A session the listing had to open is
    closed after it: listing the tools in a job's client process leaves no stdio server running there."""
    pool = session_pool()
    opened = not pool.has_session(server)
    try:
        return pool.list_tools(server)
    finally:
        if opened:
            pool.close_session(server)
