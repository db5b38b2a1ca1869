"""Tool calls and structured output of the stub model: values read from a text or made up from a JSON schema.

Pure functions of their inputs (no clock, no randomness), so the stub's replies stay byte-equal for equal
requests. Two ways to get a value for a schema:

* :func:`fill` — the *typed rules*, reading it from a text: a schema with ``const`` gives it; with ``enum``, the
  first value (in listed order) that appears in the text as a whole word, case-insensitively; a string with
  ``pattern``, the first match of the pattern; an integer, the first number in the text without a fraction; a
  number, the first number. Numbers are clamped into the schema's bounds. Anything else cannot be filled.
* :func:`generate` (and :meth:`_Walker.value`) — a value for any schema, see :func:`generate`.

Both first *resolve* a schema: ``$ref`` (``#/...`` pointers into the root, e.g. pydantic's ``#/$defs/X``) is
followed, ``allOf`` branches are merged into one schema, ``anyOf``/``oneOf`` take their first branch that is
not ``{"type": "null"}``, and a list ``type`` its first type that is not ``"null"``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "MISSING",
    "Context",
    "SchemaError",
    "Tool",
    "choose_tools",
    "fill",
    "generate",
    "parse_response_format",
    "parse_tool_choice",
    "parse_tools",
]

MISSING: Any = object()
"""What :func:`fill` returns when the text has no value for the schema."""

_MAX_REFS = 32  # $ref expansions on one path: deeper is a schema that is recursive without an end
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A number: a token of digits, with an optional fraction and sign, not part of a word ("A-1001", "3rd", "v2").
_NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?!\.?\w)")
_TOOL_TEXT_CHARS = 200
_FORMATS: dict[str, Callable[[int], str]] = {
    "date-time": lambda n: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_700_000_000 + n % 100_000_000)),
    "date": lambda n: time.strftime("%Y-%m-%d", time.gmtime(1_700_000_000 + n % 100_000_000)),
    "time": lambda n: time.strftime("%H:%M:%S", time.gmtime(n % 86_400)),
    "duration": lambda n: f"PT{n % 86_400}S",
    "email": lambda n: f"user-{n % 16**8:08x}@example.com",
    "uri": lambda n: f"https://example.com/{n % 16**8:08x}",
    "uuid": lambda n: str(uuid.UUID(int=n % 2**128)),
    "ipv4": lambda n: f"192.0.2.{n % 254 + 1}",
}


class SchemaError(ValueError):
    """A schema, a tool declaration or a ``response_format`` the stub cannot work with (a 400)."""


@dataclass(frozen=True)
class Context:
    """What generated values derive from.

    Attributes:
        text: the last ``user`` message's text (typed rules, enums, integers).
        digest: hex digest of the whole conversation (strings, numbers' fractions, booleans).
        sentences: the sentences plain strings are made of.
        tool: generating tool arguments: plain strings are ``text[:200]`` and booleans ``false``.
    """

    text: str
    digest: str
    sentences: Sequence[str]
    tool: bool = False


def _sha256_int(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16)


def _literal(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _mentioned(values: Sequence[Any], text: str) -> Any:
    """The first value that appears in ``text`` as a whole word (case-insensitive), else :data:`MISSING`."""
    for value in values:
        if re.search(rf"(?<!\w){re.escape(_literal(value))}(?!\w)", text, re.IGNORECASE):
            return value
    return MISSING


def _enum(schema: dict[str, Any]) -> list[Any]:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise SchemaError(f"'enum' must be a non-empty list, got {values!r}")
    return values


def _bound(schema: dict[str, Any], key: str) -> float | None:
    value = schema.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SchemaError(f"'{key}' must be a number, got {value!r}")
    return value


def _count(schema: dict[str, Any], key: str, default: int | None) -> int | None:
    value = schema.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise SchemaError(f"'{key}' must be an integer >= 0, got {value!r}")
    return value


def _integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """An integer's lowest and highest allowed values (exclusive bounds are inclusive ones a step inside)."""
    low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    xlow, xhigh = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    lows = [b for b in (None if low is None else math.ceil(low), None if xlow is None else math.floor(xlow) + 1)
            if b is not None]
    highs = [b for b in (None if high is None else math.floor(high), None if xhigh is None else math.ceil(xhigh) - 1)
             if b is not None]
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _clamp(value: float, schema: dict[str, Any], integer: bool) -> float:
    """``value`` moved into the schema's bounds (``minimum``, ``maximum`` and their exclusive forms)."""
    if integer:
        low, high = _integer_bounds(schema)
    else:
        low, high = _bound(schema, "minimum"), _bound(schema, "maximum")
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high
    if integer:
        return int(value)
    xlow, xhigh = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    top = min((b for b in (high, xhigh) if b is not None), default=None)
    bottom = max((b for b in (low, xlow) if b is not None), default=None)
    if xlow is not None and value <= xlow:
        value = xlow + 1 if top is None else (xlow + top) / 2
    if xhigh is not None and value >= xhigh:
        value = xhigh - 1 if bottom is None else (bottom + xhigh) / 2
    return float(value)


def _schema_type(schema: dict[str, Any]) -> str | None:
    """The (resolved) schema's type: its ``type`` (a list: the first not ``null``), or what its keywords imply."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else ("null" if kind else None)
    if kind is None:
        if "properties" in schema:
            return "object"
        return "array" if "items" in schema or "prefixItems" in schema else None
    if kind not in _TYPES:
        raise SchemaError(f"unknown type {kind!r} (expected one of {', '.join(_TYPES)})")
    return kind


def _as_schema(schema: Any) -> dict[str, Any]:
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be a JSON object, got {schema!r}")
    return schema


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


class _Walker:
    """Resolves and walks the schemas of one root document."""

    def __init__(self, root: dict[str, Any], ctx: Context):
        self.root = root
        self.ctx = ctx

    # --- resolving ---

    def pointer(self, ref: Any) -> dict[str, Any]:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise SchemaError(f"only '$ref's into the same schema ('#/$defs/Name') are supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/") if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"'$ref' {ref!r} points at nothing")
        return _as_schema(node)

    def resolve(self, schema: Any, refs: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The schema without ``$ref``, ``allOf``, ``anyOf`` and ``oneOf``, and the ``$ref``s followed to it."""
        schema = _as_schema(schema)
        while True:
            if "$ref" in schema:
                ref = schema["$ref"]
                if len(refs) >= _MAX_REFS:
                    raise SchemaError(f"the schema is recursive without an end (at '$ref' {ref!r})")
                siblings = {k: v for k, v in schema.items() if k != "$ref"}
                schema, refs = {**self.pointer(ref), **siblings}, (*refs, ref)
            elif "allOf" in schema:
                schema, refs = self.merge(schema, refs)
            elif "anyOf" in schema or "oneOf" in schema:
                schema = self.branch(schema, refs)
            else:
                return schema, refs

    def merge(self, schema: dict[str, Any], refs: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise SchemaError(f"'allOf' must be a non-empty list of schemas, got {parts!r}")
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in parts:
            part, refs = self.resolve(part, refs)
            for key, value in part.items():
                if key == "properties" and isinstance(value, dict):
                    merged["properties"] = {**value, **merged.get("properties", {})}
                elif key == "required" and isinstance(value, list):
                    merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
                else:
                    merged.setdefault(key, value)
        return merged, refs

    def branch(self, schema: dict[str, Any], refs: tuple[str, ...]) -> dict[str, Any]:
        key = "anyOf" if "anyOf" in schema else "oneOf"
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"'{key}' must be a non-empty list of schemas, got {branches!r}")
        chosen = next((b for b in branches if not _is_null(b)), branches[0])
        nulls = [b for b in branches if _is_null(b)]
        if isinstance(chosen, dict) and chosen.get("$ref") in refs and nulls:
            chosen = nulls[0]  # Optional[Self] inside Self: end the recursion with null
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
        return {**rest, **_as_schema(chosen)}

    # --- the typed rules ---

    def fill(self, schema: Any) -> Any:
        """The value the typed rules read from the text, or :data:`MISSING`."""
        resolved, _ = self.resolve(schema, ())
        text = self.ctx.text
        if "const" in resolved:
            return resolved["const"]
        if "enum" in resolved:
            return _mentioned(_enum(resolved), text)
        kind = _schema_type(resolved)
        if kind == "string" and "pattern" in resolved:
            match = _search(resolved["pattern"], text)
            return MISSING if match is None else match
        if kind in ("integer", "number"):
            integer = kind == "integer"
            numbers = [n for n in _NUMBER.findall(text) if not integer or "." not in n]
            if not numbers:
                return MISSING
            return _clamp(int(numbers[0]) if integer else float(numbers[0]), resolved, integer)
        return MISSING

    # --- generating ---

    def value(self, schema: Any, path: str, refs: tuple[str, ...]) -> Any:
        resolved, refs = self.resolve(schema, refs)
        if "const" in resolved:
            return resolved["const"]
        if "enum" in resolved:
            values = _enum(resolved)
            found = _mentioned(values, self.ctx.text)
            return values[_sha256_int(self.ctx.text) % len(values)] if found is MISSING else found
        kind = _schema_type(resolved) or "string"  # an untyped schema takes anything: a string
        return getattr(self, f"_{kind}")(resolved, path, refs)

    def _digest(self, path: str) -> int:
        return _sha256_int(f"{self.ctx.digest}\0{path}")

    def _object(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> dict[str, Any]:
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise SchemaError(f"'properties' must be an object of schemas, got {properties!r}")
        return {name: self.value(sub, f"{path}/{name}", refs) for name, sub in properties.items()}

    def _array(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> list[Any]:
        items, prefix = schema.get("items", {}), schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError(f"'prefixItems' must be a list of schemas, got {prefix!r}")
        recursive = isinstance(items, dict) and items.get("$ref") in refs  # list[Self] inside Self: minItems
        count = max(_count(schema, "minItems", 0), len(prefix), 0 if recursive or items is False else 1)
        maximum = _count(schema, "maxItems", None)
        count = count if maximum is None else min(count, maximum)
        return [self.value(prefix[i] if i < len(prefix) else items, f"{path}/{i}", refs) for i in range(count)]

    def _string(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> str:
        match = _search(schema["pattern"], self.ctx.text) if "pattern" in schema else None
        if match is not None:
            value = match
        elif schema.get("format") in _FORMATS:
            value = _FORMATS[schema["format"]](self._digest(path))
        elif self.ctx.tool:
            value = self.ctx.text[:_TOOL_TEXT_CHARS]
        else:
            number = self._digest(path)
            value = f"{self.ctx.sentences[number % len(self.ctx.sentences)]} (ref {number % 16**8:08x})"
        shortest, longest = _count(schema, "minLength", 0), _count(schema, "maxLength", None)
        if len(value) < shortest:
            value = (value + " ") * (shortest // (len(value) + 1) + 1)
        return value if longest is None else value[:longest]

    def _integer(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> int:
        return int(_clamp(len(self.ctx.text.split()), schema, integer=True))

    def _number(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> float:
        return _clamp(len(self.ctx.text.split()) + self._digest(path) % 100 / 100, schema, integer=False)

    def _boolean(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> bool:
        return False if self.ctx.tool else self._digest(path) % 2 == 1

    def _null(self, schema: dict[str, Any], path: str, refs: tuple[str, ...]) -> None:
        return None


def _search(pattern: Any, text: str) -> str | None:
    if not isinstance(pattern, str):
        raise SchemaError(f"'pattern' must be a string, got {pattern!r}")
    try:
        match = re.search(pattern, text)
    except re.error as exc:
        raise SchemaError(f"'pattern' {pattern!r} is not a regular expression: {exc}") from None
    return None if match is None else match.group(0)


def fill(schema: Any, text: str, root: dict[str, Any] | None = None) -> Any:
    """The value the typed rules read from ``text`` for ``schema`` (``$ref``s into ``root``), or :data:`MISSING`."""
    return _Walker(root if root is not None else _as_schema(schema), Context(text, "", ())).fill(schema)


def generate(schema: Any, ctx: Context) -> dict[str, Any]:
    """A JSON object that validates against ``schema`` (its root must be an object schema), made up from ``ctx``.

    Every property of an object is generated, recursively. ``const`` gives it; ``enum`` the first value found in
    ``ctx.text`` as a whole word, else ``values[sha256(ctx.text) % len(values)]``. A string: the first match of
    its ``pattern`` in the text, else a value of its ``format`` (date-time, date, time, duration, email, uri,
    uuid, ipv4), else one of ``ctx.sentences`` and ``(ref <8 hex>)``, picked by the digest of the conversation
    and the value's path; padded or cut to ``minLength``/``maxLength``. An integer: the text's word count; a
    number: the word count plus a fraction from the digest; both clamped into the bounds. A boolean: the
    digest's parity. An array: ``minItems`` items, at least one (``prefixItems`` first), at most ``maxItems``.
    null: null. A schema without a type: a string. ``Optional[Self]`` and ``list[Self]`` inside ``Self`` end
    with null and an empty list; a schema recursive without an end is a :class:`SchemaError`.
    """
    walker = _Walker(_as_schema(schema), ctx)
    resolved, _ = walker.resolve(schema, ())
    if _schema_type(resolved) != "object":
        raise SchemaError("the schema's root must be an object schema (\"type\": \"object\")")
    return walker.value(schema, "", ())


# --- tools ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A declared function tool."""

    name: str
    parameters: dict[str, Any]

    def mentioned_in(self, text: str) -> bool:
        """Whether the name appears in ``text`` as a whole word (case-insensitive; ``_``/``-`` match a space)."""
        pattern = "".join(r"[\s_-]" if c in "_-" else re.escape(c) for c in self.name)
        return re.search(rf"(?<!\w){pattern}(?!\w)", text, re.IGNORECASE) is not None

    def arguments(self, ctx: Context) -> tuple[dict[str, Any], bool]:
        """The call's arguments, and whether they make the tool *wanted* (see :func:`_argument`)."""
        walker = _Walker(self.parameters, replace(ctx, tool=True))
        try:
            return _arguments(walker)
        except SchemaError as exc:
            raise SchemaError(f"tool {self.name!r}: its parameters: {exc}") from None


def _nullable(walker: _Walker, schema: Any) -> bool:
    """Whether the schema (after ``$ref``s) allows null: a ``null`` type or an ``anyOf``/``oneOf`` null branch."""
    schema = _as_schema(schema)
    for _ in range(_MAX_REFS):
        if "$ref" not in schema:
            break
        schema = walker.pointer(schema["$ref"])
    kinds = schema.get("type")
    branches = schema.get("anyOf", schema.get("oneOf", []))
    return kinds == "null" or (isinstance(kinds, list) and "null" in kinds) or (
        isinstance(branches, list) and any(_is_null(b) for b in branches))


def _argument(walker: _Walker, name: str, schema: Any, required: bool,
              refs: tuple[str, ...]) -> tuple[Any, str]:
    """A parameter's value and where it came from: ``text`` (the typed rules), ``default`` (a ``const``, a
    boolean's false, a nullable required parameter's null), ``made`` (:meth:`_Walker.value`, for a required
    parameter without another value: plain strings are the text's first 200 characters), or ``omit``."""
    resolved, _ = walker.resolve(schema, ())
    if "const" in resolved:
        return resolved["const"], "default"
    value = walker.fill(schema)
    if value is not MISSING:
        return value, "text"
    if _schema_type(resolved) == "boolean":
        return False, "default"
    if not required:
        return None, "omit"
    if _nullable(walker, schema):
        return None, "default"
    return walker.value(schema, f"/{name}", refs), "made"


def _arguments(walker: _Walker) -> tuple[dict[str, Any], bool]:
    """The arguments, and whether the tool is wanted for them: it has required parameters, at least one came
    from the text and none was ``made``."""
    resolved, refs = walker.resolve(walker.root, ())
    properties, required = resolved.get("properties", {}), resolved.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise SchemaError("'properties' must be an object of schemas and 'required' a list of names")
    arguments, sources = {}, []
    for name, schema in properties.items():
        value, source = _argument(walker, name, schema, name in required, refs)
        if source != "omit":
            arguments[name] = value
        if name in required:
            sources.append(source)
    return arguments, "text" in sources and "made" not in sources


def parse_tools(value: Any) -> list[Tool]:
    """The request's ``tools`` (None: no tools), checked."""
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise SchemaError("'tools' must be a non-empty list of "
                          "{\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}")
    tools = [_parse_tool(index, tool) for index, tool in enumerate(value)]
    names = [tool.name for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SchemaError(f"'tools' declares {', '.join(map(repr, duplicates))} more than once")
    return tools


def _parse_tool(index: int, tool: Any) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise SchemaError(f"{where} must be an object with \"type\": \"function\"")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise SchemaError(f"{where}.function must be an object with a 'name'")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise SchemaError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
    for key, kind in (("description", str), ("strict", bool)):
        if function.get(key) is not None and not isinstance(function[key], kind):
            raise SchemaError(f"{where}.function.{key} must be a {kind.__name__}, got {function[key]!r}")
    parameters = function.get("parameters")
    parameters = {"type": "object", "properties": {}} if parameters is None else parameters
    _check_parameters(f"{where}.function.parameters", parameters)
    return Tool(name, parameters)


def _check_parameters(where: str, parameters: Any) -> None:
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise SchemaError(f"{where} must be a JSON schema of \"type\": \"object\", got {parameters!r}")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(s, (dict, bool)) for s in properties.values()):
        raise SchemaError(f"{where}.properties must be an object of schemas, got {properties!r}")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}.required must be a list of property names, got {required!r}")
    unknown = [name for name in required if name not in properties]
    if unknown:
        raise SchemaError(f"{where}.required names {', '.join(map(repr, unknown))}, not among its properties")


def parse_tool_choice(value: Any, tools: Sequence[Tool]) -> str:
    """The request's ``tool_choice``: ``auto`` (also when absent), ``none``, ``required``, or a tool's name."""
    if value is None:
        return "auto"
    if not tools:
        raise SchemaError("'tool_choice' is only allowed when 'tools' are declared")
    if value in ("auto", "none", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise SchemaError("'tool_choice' must be 'auto', 'none', 'required' or "
                          f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {value!r}")
    if name not in {tool.name for tool in tools}:
        raise SchemaError(f"'tool_choice' names the function {name!r}, which 'tools' does not declare")
    return name


def choose_tools(tools: Sequence[Tool], choice: str, ctx: Context) -> list[tuple[Tool, dict[str, Any]]]:
    """The calls to make (tool and arguments, in declared order) under ``choice`` (not ``none``).

    A tool is *wanted* when it is mentioned in ``ctx.text`` or its required parameters all have a value
    without making one up, at least one from the text (:func:`_arguments`). A named choice calls that tool;
    otherwise every wanted tool is called, and with none wanted ``required`` calls the first tool and ``auto``
    none.
    """
    candidates = [(tool, *tool.arguments(ctx)) for tool in tools]  # every tool's parameters get checked
    if choice not in ("auto", "required"):
        return [(tool, arguments) for tool, arguments, _ in candidates if tool.name == choice]
    wanted = [(tool, arguments) for tool, arguments, from_text in candidates
              if from_text or tool.mentioned_in(ctx.text)]
    if wanted or choice == "auto":
        return wanted
    return [candidates[0][:2]]


# --- response_format ------------------------------------------------------------------------------------------


def parse_response_format(value: Any) -> tuple[str, dict[str, Any] | None]:
    """The request's ``response_format``: (``text``, None), (``json_object``, None) or (``json_schema``, schema)."""
    if value is None:
        return "text", None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return kind, None
    if kind != "json_schema":
        raise SchemaError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                          f"{{\"type\": \"json_schema\", \"json_schema\": {{\"name\", \"schema\"}}}}, got {value!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise SchemaError("response_format.json_schema must be an object with 'name' and 'schema'")
    if not isinstance(spec.get("name"), str) or not _NAME.fullmatch(spec["name"]):
        raise SchemaError("response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-', "
                          f"got {spec.get('name')!r}")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise SchemaError(f"response_format.json_schema.strict must be a boolean, got {spec['strict']!r}")
    if not isinstance(spec.get("schema"), dict):
        raise SchemaError("response_format.json_schema.schema must be a JSON schema object, "
                          f"got {spec.get('schema')!r}")
    return kind, spec["schema"]
