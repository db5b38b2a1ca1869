"""A function's signature as a model sees it: its arguments, their JSON schema, its name and description.

A leaf of the public API: :class:`~flink_agents_replay.api.resources.Tool` resolves its function's signature here
when it is made, and :mod:`flink_agents_replay.api.tools` builds model-facing tool schemas on it. Types come from
the function's hints, descriptions from the ``Args:`` section of its docstring (Google style), and pydantic
builds the schema and validates a model's arguments.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Argument", "arguments_model", "bound_arguments", "function_arguments", "function_schema",
           "model_json_schema", "schema_of", "summary", "takes_any_keyword", "tool_name"]

_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")  # name (type): text


@dataclass(frozen=True)
class Argument:
    """One argument of a tool's function: its resolved type, its default (``...``: required), its description."""

    name: str
    annotation: Any
    default: Any = ...
    description: str | None = None


def function_arguments(function: Callable[..., Any]) -> tuple[Argument, ...]:
    """The arguments of ``function``: types from its hints, resolved (``Any`` without one), descriptions from the
    ``Args:`` section of its docstring. Plain data and types, so a tool carries them to the workers. Arguments a
    ``functools.partial`` binds are not the model's to give: they are left out."""
    descriptions = _argument_descriptions(inspect.getdoc(_described(function)) or "")
    hints = _type_hints(function)
    bound = bound_arguments(function)
    return tuple(
        Argument(parameter.name, hints.get(parameter.name, Any),
                 ... if parameter.default is parameter.empty else parameter.default, descriptions.get(parameter.name))
        for parameter in inspect.signature(function).parameters.values()
        if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) and parameter.name not in bound)


def takes_any_keyword(function: Callable[..., Any]) -> bool:
    """Whether ``function`` takes keyword arguments it does not name (``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature Python can read: nothing to check the names against
        return True
    return any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters)


def bound_arguments(function: Callable[..., Any]) -> frozenset[str]:
    """The keyword arguments a ``functools.partial`` sets (nested partials are flattened by Python)."""
    return frozenset(function.keywords) if isinstance(function, functools.partial) else frozenset()


def tool_name(function: Callable[..., Any]) -> str:
    """The name a model sees by default: the function's (a partial's underlying one), a class's, or a callable
    object's class's."""
    target = _unwrapped(function)
    if inspect.isroutine(target) or isinstance(target, type):
        return getattr(target, "__name__", None) or "tool"
    return type(target).__name__


def _unwrapped(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` without its ``functools.partial`` layers."""
    while isinstance(function, functools.partial):
        function = function.func
    return function


def _described(function: Callable[..., Any]) -> Callable[..., Any]:
    """The routine whose docstring and hints describe a call of ``function``: itself, a partial's function, a
    class's ``__init__``, a callable object's ``__call__``."""
    target = _unwrapped(function)
    if inspect.isroutine(target):
        return target
    return target.__init__ if isinstance(target, type) else type(target).__call__


def arguments_model(name: str, arguments: Sequence[Argument]) -> Any:
    """A pydantic model of ``arguments``: their JSON schema, and what validates a model's arguments."""
    import pydantic

    return pydantic.create_model(f"{name}_arguments", **{
        a.name: (a.annotation, pydantic.Field(a.default, description=a.description)) for a in arguments})


def schema_of(model: Any) -> dict[str, Any]:
    """The JSON schema a model is shown of an arguments model (without pydantic's titles)."""
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


_model_schemas: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()


def model_json_schema(kind: type) -> dict[str, Any]:
    """A pydantic model class's JSON schema, made once per class and process (pydantic takes about a millisecond,
    and each structured call asks twice: for its digest and its request). Do not change the dict returned."""
    schema = _model_schemas.get(kind)
    if schema is None:
        schema = _model_schemas[kind] = kind.model_json_schema()
    return schema


def function_schema(function: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of ``function``'s arguments (:func:`function_arguments`; defaults make them optional)."""
    return schema_of(arguments_model(tool_name(function), function_arguments(function)))


def _type_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's hints resolved (``from __future__ import annotations`` makes them strings)."""
    try:
        return typing.get_type_hints(_described(function), include_extras=True)
    except (NameError, TypeError) as exc:
        raise TypeError(f"the type hints of tool {getattr(function, '__qualname__', function)!r} cannot be "
                        f"resolved ({exc}): define the types they name at module level, or give schema=") from exc


def summary(function: Callable[..., Any]) -> str:
    """The docstring's text before its ``Args:``/``Returns:`` sections (the tool's description): the function's,
    else a class's or a callable object's class's."""
    described, target = _described(function), _unwrapped(function)
    doc = inspect.getdoc(described) if described.__doc__ else None  # not a C slot's "Call self as a function."
    if not doc and not inspect.isroutine(target):
        doc = inspect.getdoc(target if isinstance(target, type) else type(target))
    return re.split(r"\n\s*(?:Args|Arguments|Parameters|Returns|Raises):\s*\n", doc or "", maxsplit=1)[0].strip()


def _argument_descriptions(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Args:`` section; deeper-indented lines continue an entry."""
    section = re.split(r"(?:^|\n)\s*(?:Args|Arguments|Parameters):\s*\n", doc, maxsplit=1)
    lines = [line for line in section[1].splitlines()] if len(section) == 2 else []
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    found: dict[str, str] = {}
    last = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent < indents[0]:  # the section ended
            break
        entry = _ARG_LINE.match(line.strip()) if indent == indents[0] else None
        if entry:
            last = entry.group(1).lstrip("*")
            found[last] = entry.group(2).strip()
        elif last is not None:
            found[last] += " " + line.strip()
    return found
