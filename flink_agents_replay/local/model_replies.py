"""The replies of the local stub model and order service: pure functions of the request.

Equal requests get byte-equal bodies (``created`` and the ids come from a digest, not the clock), so a request
made again after a failover is answered exactly as the first time. :mod:`.model_server` serves them and counts
what it executes. The rules, by endpoint:

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
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.local.embeddings import DIMENSIONS, embed
from flink_agents_replay.local.structured import (
    Context,
    SchemaError,
    choose_tools,
    generate,
    parse_response_format,
    parse_tool_choice,
    parse_tools,
)

__all__ = ["MODEL_NAME", "VERBOSE_MODEL_NAME", "VERBOSE_SENTENCE", "BadRequest", "Response", "chat_completion",
           "choose_category", "draft_reply", "embeddings", "error", "json_bytes", "MODELS", "order_details",
           "parse_chat", "parse_embeddings"]

MODEL_NAME = "stub-model"
"""The one model ``GET /v1/models`` lists (chat requests may name any model)."""

VERBOSE_MODEL_NAME = "stub-model-verbose"
"""A second model for replay tests: any model name containing ``verbose`` appends :data:`VERBOSE_SENTENCE`."""

VERBOSE_SENTENCE = "Please let us know if there is anything else we can help you with."
"""The sentence a ``verbose`` model appends to its text replies."""


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


@dataclass(frozen=True)
class Response:
    """A reply: its status and body, and what an executed chat completion adds to the totals."""

    status: int
    body: bytes
    # What an executed chat completion adds to the totals (zero for everything else).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: bool = False


class BadRequest(ValueError):
    """A request the service answers 400 without executing it."""


def json_bytes(value: Any) -> bytes:
    # Fixed key order and separators: equal values give equal bytes.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def error(status: int, message: str) -> Response:
    return Response(status, json_bytes({"error": {"message": message, "type": "invalid_request_error"}}))


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


def parse_chat(raw: bytes) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required: a non-empty list of {role, content} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}] must be an object with a string 'role'")
    if not isinstance(request.get("model", MODEL_NAME), str):
        raise BadRequest("'model' must be a string")
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
    return _sha256_hex(json_bytes([[m.get("role"), _text(m.get("content"))] for m in messages]).decode())


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
            return json_bytes(generate(schema, ctx)).decode()
        except SchemaError as exc:
            raise BadRequest(f"response_format.json_schema.schema: {exc}") from None
    text = _text_reply(request, last_user)
    return json_bytes({"reply": text}).decode() if kind == "json_object" else text


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
        raise BadRequest(f"'parallel_tool_calls' must be a boolean, got {parallel!r}")
    if not tools or choice == "none" or _has_tool_results(request["messages"]):
        return []
    calls = choose_tools(tools, choice, ctx)
    return [{"id": f"call_{_sha256_hex(canonical + chr(0) + str(index))[:24]}", "type": "function",
             "function": {"name": tool.name, "arguments": json_bytes(arguments).decode()}}
            for index, (tool, arguments) in enumerate(calls[:1] if parallel is False else calls)]


def chat_completion(request: dict[str, Any], canonical: str) -> Response:
    """The reply to a parsed request; a bad ``tools``, ``tool_choice`` or ``response_format`` is a BadRequest."""
    messages = request["messages"]
    user_texts = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last_user = user_texts[-1] if user_texts else None
    ctx = Context(last_user or "", _conversation_digest(messages), _DRAFT_SENTENCES)
    try:
        content = _content(request, ctx, last_user)
        calls = _tool_calls(request, ctx, canonical)
    except SchemaError as exc:
        raise BadRequest(str(exc)) from None
    if calls:
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        completion_tokens = sum(len(c["function"]["name"].split()) + len(c["function"]["arguments"].split())
                                for c in calls)
    else:
        message = {"role": "assistant", "content": content}
        completion_tokens = len(content.split())
    digest = _sha256_hex(canonical)
    prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages)
    return Response(200, json_bytes({
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        # From the digest, not the clock: equal requests give byte-equal replies.
        "created": 1_700_000_000 + int(digest[24:32], 16) % 100_000_000,
        "model": request.get("model", MODEL_NAME),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }), prompt_tokens, completion_tokens, bool(calls))


def parse_embeddings(raw: bytes) -> tuple[list[str], int, str, bool]:
    try:
        request = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    texts = request.get("input") if isinstance(request, dict) else None
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("'input' is required: a string or a non-empty list of strings")
    dimensions = request.get("dimensions", DIMENSIONS)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 1 <= dimensions <= 4096:
        raise BadRequest(f"'dimensions' must be an integer from 1 to 4096, got {dimensions!r}")
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest(f"'encoding_format' must be 'float' or 'base64', got {encoding!r}")
    return texts, dimensions, str(request.get("model", MODEL_NAME)), encoding == "base64"


def _vector(values: list[float], as_base64: bool) -> list[float] | str:
    # base64: little-endian float32s, as OpenAI sends them (the openai SDK asks for this by default).
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode() if as_base64 else values


def embeddings(texts: list[str], dimensions: int, model: str, as_base64: bool) -> Response:
    tokens = sum(len(t.split()) for t in texts)
    return Response(200, json_bytes({
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


MODELS = Response(200, json_bytes({
    "object": "list",
    "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "flink-agents-replay"}],
}))
