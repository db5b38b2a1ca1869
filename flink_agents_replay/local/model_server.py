"""A local stand-in for an OpenAI-compatible model and an order-lookup tool, counting every request.

The demo and the tests must run offline, and they must count what an agent *really* asked for: the
counts live here, in a process (or thread) outside the Flink Python worker, so a worker killed and
restarted cannot lose or repeat them. Standard library only (:class:`http.server.ThreadingHTTPServer`).

Endpoints:

* ``POST /v1/chat/completions`` — OpenAI request and reply format. The reply is a pure function of the
  request, so equal requests get byte-equal bodies (``created`` and the ids come from a digest, not the
  clock). Its text depends on the last ``user`` message: if a line starts with ``Categories:`` followed by
  comma-separated names, the reply is exactly one of them — the first (in listed order) that appears as a
  whole word, case-insensitively, in the rest of the message, else one picked by hash of the message.
  Otherwise the reply is a short draft (``Thank you for reaching out. ... (ref 1a2b3c4d)``) derived from
  the roles and texts of all messages (a ``tool`` message's too; ``content: null`` is no text). A model
  name containing ``verbose`` (:data:`VERBOSE_MODEL_NAME`) appends :data:`VERBOSE_SENTENCE` to that text.
  ``usage``: ``prompt_tokens`` are the words of all messages' texts, ``completion_tokens`` the words of the
  reply's content, or of a tool-call reply's function names and argument JSON.

  *Tools* (``tools``: OpenAI function tools; ``tool_choice``: ``auto`` (the default), ``none``, ``required``
  or ``{"type": "function", "function": {"name": ...}}``; ``parallel_tool_calls``). Unless ``tool_choice`` is
  ``none`` or a ``tool`` (or legacy ``function``) message follows the last ``user`` message (the results are
  in: the reply is text again), the reply may be ``content: null`` with ``tool_calls`` (ids ``call_<digest>``,
  ``arguments`` a JSON string) and ``finish_reason: "tool_calls"``. Reading values from the last user message
  (*typed rules*): an ``enum`` gives its first value found as a whole word, a string with ``pattern`` its
  first match, an integer or number the first number (a token, not digits inside ``A-1001``), clamped to its
  bounds; a ``const`` gives it. Arguments: every parameter these rules fill; booleans ``false``; a required
  one they cannot fill is ``null`` if nullable, else made up as for ``json_schema`` below except that plain
  strings are the message's first 200 characters. A tool is *wanted* if its name appears as a whole word
  (case-insensitive, ``_`` and ``-`` also match a space), or if it has required parameters, none made up and
  at least one filled from the text. Called: a named ``tool_choice``'s tool; else every wanted tool, in
  declared order (only the first with ``parallel_tool_calls: false``); with none wanted ``required`` calls the
  first tool and ``auto`` answers with text. Tool calls take precedence over ``response_format``.

  *Structured output* (``response_format``). ``{"type": "json_object"}``: the content is ``{"reply": <the
  text>}``. ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``: the content is an object
  valid against the schema (root: an object schema), made up from it (see :mod:`.structured`): ``$ref``
  (``#/$defs/...``), ``allOf`` (merged), ``anyOf``/``oneOf`` (the first non-null branch) resolved; every
  property; ``const``; ``enum`` as for ``Categories:`` (the first value found as a whole word, else by hash);
  strings: the ``pattern``'s first match, a ``format`` value, else a draft sentence with a ref (fitted to
  ``minLength``/``maxLength``); integers the message's word count and numbers that plus a fraction, clamped to
  their bounds; booleans a digest's parity; arrays ``minItems`` items, at least 1; null. Malformed ``tools``,
  ``tool_choice`` or ``response_format`` and schemas it cannot fill are 400s, not executed.
* ``POST /v1/embeddings`` — OpenAI request and reply format (``input``: a string or a list of strings,
  optional ``dimensions``): hashed bags of words (:mod:`flink_agents_replay.local.embeddings`), so texts that
  share words are near each other. Counted as ``embeddings``; not subject to the delay or an outage.
* ``GET /v1/models`` — one model, ``stub-model`` (any model name is accepted and echoed; ``verbose`` in it
  lengthens text replies, see above).
* ``GET /orders/<order_id>`` — a deterministic order (status, items, total, carrier) derived from the id;
  an empty id is 404.
* ``GET /stats`` — the counters as JSON (see :class:`ServerStats`; also the token totals and the tool-call
  replies of executed chat completions); ``POST /stats/reset`` zeroes them.

Every chat and order request waits ``delay_ms`` first (a slow model), or the ``X-Stub-Delay-Ms`` header's
value. An *outage* can be scheduled (:meth:`StubModelServer.schedule_outage`, tests): once a given number of
chat completions has been executed, every chat request is answered ``503`` for a number of seconds
(counted as ``unavailable``, not executed), then the service answers again.

A request carrying an ``Idempotency-Key`` header is executed at most once per key and endpoint: a later
one gets the stored reply, and one arriving while the first is still under way waits for it.

In-process (tests)::

    with StubModelServer() as server:          # port 0: any free port
        ChatModel("stub-model", base_url=server.base_url).invoke(prompt="hello")
        server.stats().chat                     # 1

As a process (the CLI, the demo): :class:`LocalModelServer`, or
``python -m flink_agents_replay.local.model_server --port 8000 --delay-ms 0``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import math
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from flink_agents_replay.local.embeddings import DIMENSIONS, embed
from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.paths import home_dir
from flink_agents_replay.local.processes import (
    RecordedProcess,
    claim_port,
    log_tail,
    pid_alive,
    spawn_service,
    wait_until_ready,
)
from flink_agents_replay.local.structured import (
    Context,
    SchemaError,
    choose_tools,
    generate,
    parse_response_format,
    parse_tool_choice,
    parse_tools,
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

MODEL_NAME = "stub-model"
"""The one model ``GET /v1/models`` lists (chat requests may name any model)."""

VERBOSE_MODEL_NAME = "stub-model-verbose"
"""A second model for replay tests: any model name containing ``verbose`` appends :data:`VERBOSE_SENTENCE`."""

VERBOSE_SENTENCE = "Please let us know if there is anything else we can help you with."
"""The sentence a ``verbose`` model appends to its text replies."""

DELAY_HEADER = "X-Stub-Delay-Ms"
IDEMPOTENCY_HEADER = "Idempotency-Key"

_DRAFT_SENTENCES = (
    "We have looked into your request and will follow up shortly.",
    "Our team has received the details and is working on a resolution.",
    "We are sorry for the inconvenience and appreciate your patience.",
    "Your case has been forwarded to the right specialist.",
    "We have noted the issue and will update you within one business day.",
)
_ORDER_STATUSES = ("processing", "shipped", "delivered", "returned")
_CARRIERS = ("UPS", "FedEx", "DHL", "USPS")
_CATEGORIES_LINE = re.compile(r"^[ \t]*categories[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)


# --- counters ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerStats:
    """What the server executed since it started (or since the last reset).

    Attributes:
        chat: chat completions executed.
        orders: order lookups executed.
        embeddings: embedding requests executed.
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
        """Chat completions, order lookups and embedding requests executed."""
        return self.chat + self.orders + self.embeddings

    def to_dict(self) -> dict[str, int]:
        """The ``GET /stats`` body."""
        return {**asdict(self), "executions": self.executions}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerStats:
        """Parse a ``GET /stats`` body (extra fields are ignored)."""
        return cls(**{f.name: int(data.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    # What an executed chat completion adds to the totals (zero for everything else).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: bool = False


class _Slot:
    """The reply to one idempotency key: pending until ``done`` is set; ``response`` None if it failed."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: _Response | None = None


class _State:
    """Counters and the idempotency store, shared by all request threads under one lock."""

    def __init__(self, delay_ms: float):
        self.delay_ms = delay_ms
        self._lock = threading.Lock()
        self._executions = {"chat": 0, "orders": 0, "embeddings": 0}
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
                               embeddings=self._executions["embeddings"],
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

    def run(self, endpoint: str, canonical: str, key: str | None, delay_s: float,
            produce: Callable[[], _Response]) -> _Response:
        """Execute a request, or replay the stored reply to its idempotency key."""
        if key is None:
            return self._execute(endpoint, canonical, delay_s, produce)
        slot_key = (endpoint, key)
        while True:
            with self._lock:
                slot = self._slots.get(slot_key)
                owner = slot is None
                if owner:
                    slot = self._slots[slot_key] = _Slot()
            if owner:
                break
            slot.done.wait()
            if slot.response is not None:
                with self._lock:
                    self._replays += 1
                return slot.response
            # The first attempt ended without a reply (and left the store): this request takes over.
        try:
            slot.response = self._execute(endpoint, canonical, delay_s, produce)
            return slot.response
        finally:
            if slot.response is None:
                with self._lock:
                    if self._slots.get(slot_key) is slot:
                        del self._slots[slot_key]
            slot.done.set()

    def _execute(self, endpoint: str, canonical: str, delay_s: float,
                 produce: Callable[[], _Response]) -> _Response:
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
                time.sleep(delay_s)  # the simulated model at work
            response = produce()
            return response
        finally:
            with self._lock:
                self._in_flight -= 1
                if response is not None:
                    self._tokens["prompt_tokens"] += response.prompt_tokens
                    self._tokens["completion_tokens"] += response.completion_tokens
                    self._tokens["tool_call_replies"] += response.tool_calls


# --- replies ------------------------------------------------------------------------------------------------


class _BadRequest(ValueError):
    pass


def _json_bytes(value: Any) -> bytes:
    # Fixed key order and separators: equal values give equal bytes.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _error(status: int, message: str) -> _Response:
    return _Response(status, _json_bytes({"error": {"message": message, "type": "invalid_request_error"}}))


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _text(content: Any) -> str:
    """A message's text: a plain string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict)
                         and isinstance(part.get("text"), str))
    return ""


def _parse_chat(raw: bytes) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise _BadRequest("the body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' is required: a non-empty list of {role, content} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest(f"messages[{index}] must be an object with a string 'role'")
    if not isinstance(request.get("model", MODEL_NAME), str):
        raise _BadRequest("'model' must be a string")
    return request


def choose_category(text: str) -> str | None:
    """The category a ``Categories: a, b, c`` line in ``text`` gets, or None without such a line.

    The first listed name that appears as a whole word (case-insensitive) in the rest of the text wins;
    with none, the pick is ``names[sha256(text) % len(names)]``.
    """
    line = _CATEGORIES_LINE.search(text)
    if not line:
        return None
    names = [name.strip().strip("\"'`.").strip() for name in line.group(1).split(",")]
    names = [name for name in names if name]
    if not names:
        return None
    rest = text[:line.start()] + text[line.end():]
    for name in names:
        # Lookarounds rather than \b: names may start or end with punctuation ("C++", "e-mail").
        if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", rest, re.IGNORECASE):
            return name
    return names[int(_sha256_hex(text), 16) % len(names)]


def _conversation_digest(messages: Sequence[dict[str, Any]]) -> str:
    return _sha256_hex(_json_bytes([[m.get("role"), _text(m.get("content"))] for m in messages]).decode())


def draft_reply(messages: Sequence[dict[str, Any]]) -> str:
    """The draft answer to a conversation without a ``Categories:`` line."""
    digest = _conversation_digest(messages)
    sentence = _DRAFT_SENTENCES[int(digest, 16) % len(_DRAFT_SENTENCES)]
    return f"Thank you for reaching out. {sentence} (ref {digest[:8]})"


def _text_reply(request: dict[str, Any], last_user: str | None) -> str:
    category = choose_category(last_user) if last_user is not None else None
    reply = category if category is not None else draft_reply(request["messages"])
    if "verbose" in request.get("model", MODEL_NAME).lower():
        reply = f"{reply} {VERBOSE_SENTENCE}"
    return reply


def _content(request: dict[str, Any], ctx: Context, last_user: str | None) -> str:
    """The reply's text: the category or draft, or JSON for a ``response_format`` asking for it."""
    kind, schema = parse_response_format(request.get("response_format"))
    if kind == "json_schema":
        try:
            return _json_bytes(generate(schema, ctx)).decode()
        except SchemaError as exc:
            raise _BadRequest(f"response_format.json_schema.schema: {exc}") from None
    text = _text_reply(request, last_user)
    return _json_bytes({"reply": text}).decode() if kind == "json_object" else text


def _has_tool_results(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a ``tool`` (or legacy ``function``) message follows the last ``user`` message."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    return any(m["role"] in ("tool", "function") for m in messages[last_user + 1:])


def _tool_calls(request: dict[str, Any], ctx: Context, canonical: str) -> list[dict[str, Any]]:
    """The ``tool_calls`` of the reply: empty for a text reply."""
    tools = parse_tools(request.get("tools"))
    choice = parse_tool_choice(request.get("tool_choice"), tools)
    parallel = request.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _BadRequest(f"'parallel_tool_calls' must be a boolean, got {parallel!r}")
    if not tools or choice == "none" or _has_tool_results(request["messages"]):
        return []
    calls = choose_tools(tools, choice, ctx)
    return [{"id": f"call_{_sha256_hex(canonical + chr(0) + str(index))[:24]}", "type": "function",
             "function": {"name": tool.name, "arguments": _json_bytes(arguments).decode()}}
            for index, (tool, arguments) in enumerate(calls[:1] if parallel is False else calls)]


def _chat_completion(request: dict[str, Any], canonical: str) -> _Response:
    """The reply to a parsed request; a bad ``tools``, ``tool_choice`` or ``response_format`` is a _BadRequest."""
    messages = request["messages"]
    user_texts = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last_user = user_texts[-1] if user_texts else None
    ctx = Context(last_user or "", _conversation_digest(messages), _DRAFT_SENTENCES)
    try:
        content = _content(request, ctx, last_user)
        calls = _tool_calls(request, ctx, canonical)
    except SchemaError as exc:
        raise _BadRequest(str(exc)) from None
    if calls:
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        completion_tokens = sum(len(c["function"]["name"].split()) + len(c["function"]["arguments"].split())
                                for c in calls)
    else:
        message = {"role": "assistant", "content": content}
        completion_tokens = len(content.split())
    digest = _sha256_hex(canonical)
    prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages)
    return _Response(200, _json_bytes({
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        # From the digest, not the clock: equal requests give byte-equal replies.
        "created": 1_700_000_000 + int(digest[24:32], 16) % 100_000_000,
        "model": request.get("model", MODEL_NAME),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }), prompt_tokens, completion_tokens, bool(calls))


def _parse_embeddings(raw: bytes) -> tuple[list[str], int, str, bool]:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _BadRequest(f"the body is not valid JSON: {exc}") from None
    texts = request.get("input") if isinstance(request, dict) else None
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise _BadRequest("'input' is required: a string or a non-empty list of strings")
    dimensions = request.get("dimensions", DIMENSIONS)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= 4096:
        raise _BadRequest(f"'dimensions' must be an integer from 1 to 4096, got {dimensions!r}")
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise _BadRequest(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    return texts, dimensions, str(request.get("model", MODEL_NAME)), encoding == "base64"


def _vector(values: list[float], as_base64: bool) -> list[float] | str:
    # base64: little-endian float32s, as OpenAI sends them (the openai SDK asks for this by default).
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode() if as_base64 else values


def _embeddings(texts: list[str], dimensions: int, model: str, as_base64: bool) -> _Response:
    tokens = sum(len(t.split()) for t in texts)
    return _Response(200, _json_bytes({
        "object": "list", "model": model,
        "data": [{"object": "embedding", "index": i, "embedding": _vector(embed(t, dimensions), as_base64)}
                 for i, t in enumerate(texts)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))


def order_details(order_id: str) -> dict[str, Any]:
    """The order ``GET /orders/<order_id>`` returns: every id exists, its fields derive from sha256(id)."""
    number = int(_sha256_hex(order_id), 16)
    return {
        "order_id": order_id,
        "status": _ORDER_STATUSES[number % len(_ORDER_STATUSES)],
        "items": 1 + (number >> 8) % 5,
        "total": (500 + (number >> 16) % 50_000) / 100,
        "carrier": _CARRIERS[(number >> 40) % len(_CARRIERS)],
    }


_MODELS = _Response(200, _json_bytes({
    "object": "list",
    "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "flink-agents-replay"}],
}))


# --- HTTP ---------------------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a slow request must not keep the process alive after stop()
    request_queue_size = 256  # the default backlog of 5 resets connections when a job opens dozens at once

    def __init__(self, address: tuple[str, int], state: _State):
        super().__init__(address, _Handler)
        self.state = state


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "flink-agents-replay-stub/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the demo's output

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/v1/models":
            self._send(_MODELS)
        elif path == "/stats":
            self._send(_Response(200, _json_bytes(self.server.state.stats().to_dict())))
        elif path == "/orders" or path.startswith("/orders/"):
            order_id = unquote(path[len("/orders/"):])
            if not order_id:
                self._send(_error(404, "no order id: GET /orders/<order_id>"))
                return
            self._run("orders", order_id, lambda: _Response(200, _json_bytes(order_details(order_id))))
        else:
            self._send(_error(404, f"no route GET {path}"))

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        try:
            raw = self.rfile.read(max(0, int(self.headers.get("Content-Length") or 0)))
        except ValueError:
            self._send(_error(400, "Content-Length must be a number (chunked bodies are not supported)"))
            return
        if path == "/v1/chat/completions":
            try:
                request = _parse_chat(raw)
                canonical = _json_bytes(request).decode()
                # A pure function of the request: made now, so that a bad tool or schema is a 400, not executed.
                reply = _chat_completion(request, canonical)
            except _BadRequest as exc:
                self._send(_error(400, str(exc)))
                return
            self._run("chat", canonical, lambda: reply)
        elif path == "/v1/embeddings":
            try:
                texts, dimensions, model, as_base64 = _parse_embeddings(raw)
            except _BadRequest as exc:
                self._send(_error(400, str(exc)))
                return
            self._run_undelayed("embeddings", _json_bytes([texts, dimensions, as_base64]).decode(),
                                lambda: _embeddings(texts, dimensions, model, as_base64))
        elif path == "/stats/reset":
            self.server.state.reset()
            self._send(_Response(200, _json_bytes(self.server.state.stats().to_dict())))
        else:
            self._send(_error(404, f"no route POST {path}"))

    def _run_undelayed(self, endpoint: str, canonical: str, produce: Callable[[], _Response]) -> None:
        """Execute (or replay by idempotency key) without the delay: embeddings are not the slow model."""
        key = self.headers.get(IDEMPOTENCY_HEADER) or None
        self._send(self.server.state.run(endpoint, canonical, key, 0.0, produce))

    def _run(self, endpoint: str, canonical: str, produce: Callable[[], _Response]) -> None:
        header = self.headers.get(DELAY_HEADER)
        try:
            delay_ms = self.server.state.delay_ms if header is None else float(header)
            if not math.isfinite(delay_ms) or delay_ms < 0:
                raise ValueError
        except ValueError:
            self._send(_error(400, f"{DELAY_HEADER} must be a number of milliseconds >= 0, got {header!r}"))
            return
        if self.server.state.refuse_now(endpoint):
            self._send(_error(503, "the model is unavailable (a scheduled outage)"))
            return
        key = self.headers.get(IDEMPOTENCY_HEADER) or None
        self._send(self.server.state.run(endpoint, canonical, key, delay_ms / 1000, produce))

    def _send(self, response: _Response) -> None:
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            # The caller is gone (a killed TaskManager): expected in failover tests, so one line, no traceback.
            self.close_connection = True
            log.info("the client of %s %s went away before its reply", self.command, urlsplit(self.path).path)


class StubModelServer:
    """The stub service on a background thread of this process.

    Args:
        port: port on ``host``; ``0`` picks a free one (read it back from :attr:`port`).
        delay_ms: wait before executing each chat or order request (``X-Stub-Delay-Ms`` overrides it).
        host: address to listen on.
    """

    def __init__(self, port: int = 0, delay_ms: float = 0, *, host: str = "127.0.0.1"):
        if not 0 <= delay_ms < math.inf:
            raise ValueError(f"delay_ms must be a finite number >= 0, got {delay_ms}")
        self.host = host
        self._requested_port = port
        self._state = _State(delay_ms)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> StubModelServer:
        """Bind and serve on a daemon thread; returns ``self``. A taken port raises :class:`LocalServiceError`."""
        if self._httpd is not None:
            return self
        try:
            self._httpd = _HTTPServer((self.host, self._requested_port), self._state)
        except OSError as exc:
            raise LocalServiceError(
                f"cannot listen on {self.host}:{self._requested_port} ({exc.strerror}): stop what listens "
                "there, or choose another port (--port N, or --port 0 for any free port)"
            ) from None
        # A short poll interval: stop() returns within 50 ms instead of the default 500.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="stub-model-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (requests under way are abandoned)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd = self._thread = None

    @property
    def port(self) -> int:
        """The port it listens on (known once started)."""
        if self._httpd is None:
            raise RuntimeError("the stub model server is not started: call start() first")
        return self._httpd.server_address[1]

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
