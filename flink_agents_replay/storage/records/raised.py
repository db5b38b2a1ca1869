"""Exceptions as the journal keeps them: their type, arguments and attributes, so they come back as raised.

A call that raised is journaled with its exception, and reusing the call raises that exception again, so
an action that handled it (``except ConnectionError:``) takes the same branch after a failure. An
exception that survives a pickle round trip with its type is journaled as it is (a user value; built-in
exceptions keep attributes that live outside ``__dict__``, such as ``OSError.filename``). The user-value
pickler rebuilds an exception class defined in Python without calling its constructor
(:mod:`flink_agents_replay.storage.formats.plain`), so constructors taking keyword-only or other arguments than they
store (HTTP client errors that need a ``response=``) round trip too; a stand-in type would send the action down
another branch. What still does not (a subclass of a built-in exception with fields in C, such as
``StopIteration``, whose constructor refuses its ``args``; an exception that reduces itself and fails; a type
pickle cannot name) is stored as its type (by reference, like any user value), ``args`` and the instance's
attributes, and rebuilt the same way.

An attribute that cannot be pickled (an open connection, a lock) is left out and named in the rebuilt
exception's notes; the type and message always survive.
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay.storage.formats.plain import dump_user, load_user

__all__ = ["decode_exception", "encode_exception"]

_VERSION = 1


def _picklable(value: Any) -> bool:
    try:
        dump_user(value)
    except Exception:  # noqa: BLE001 - pickling raises many types
        return False
    return True


def _round_trips(exc: BaseException) -> bool:
    try:
        return type(load_user(dump_user(exc))) is type(exc)
    except Exception:  # noqa: BLE001 - a constructor that does not take exc.args, an unpicklable attribute...
        return False


def encode_exception(exc: BaseException) -> BaseException | dict[str, Any]:
    """What the journal keeps of ``exc``: the exception itself when pickle rebuilds it, else plain data that
    :func:`decode_exception` turns back into an exception of the same type."""
    if _round_trips(exc):
        return exc
    kind: type = type(exc)
    args = exc.args if _picklable(exc.args) else tuple(str(arg) for arg in exc.args)
    attributes = {name: value for name, value in vars(exc).items() if _picklable(value)}
    dropped = sorted(set(vars(exc)) - set(attributes))
    if not _picklable(kind):  # a type pickle cannot name: keep what people need to read
        kind, args, attributes = RuntimeError, (f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}",), {}
    return {"version": _VERSION, "type": kind, "args": args, "attributes": attributes, "dropped": dropped}


def decode_exception(encoded: Any) -> BaseException:
    """The exception :func:`encode_exception` encoded (an exception object, as older records hold, as is)."""
    if isinstance(encoded, BaseException):
        return encoded
    kind = encoded["type"]
    exc = kind.__new__(kind, *encoded["args"])
    exc.args = tuple(encoded["args"])
    exc.__dict__.update(encoded["attributes"])
    if encoded["dropped"] and hasattr(exc, "add_note"):
        exc.add_note(f"flink-agents-replay: attributes {encoded['dropped']} could not be journaled and are missing")
    return exc
