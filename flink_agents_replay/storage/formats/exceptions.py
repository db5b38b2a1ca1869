"""Exceptions as plain data: this package's own by a stable name, the user's as user values.

A journaled call that raised keeps its exception, so that a reused call raises it again. Three forms:

* ``{"package": <name>, "args": ..., "attributes": ...}`` for this package's exceptions (``CallBlocked``,
  ``ChatModelError``...): their name in :data:`PACKAGE_EXCEPTIONS`, never their module path. A renamed
  class keeps its old name in that table.
* ``{"pickled": ...}`` for any other exception that pickle rebuilds with its type (a user value).
* ``{"rebuilt": ..., "args": ..., "attributes": ..., "dropped": [...]}`` for what
  :func:`flink_agents_replay.storage.records.raised.encode_exception` turned into parts (an exception pickle cannot
  rebuild): its type is a user value (or a package name), args and attributes are user values.

Arguments and attributes are user values (pickled bytes) in every form.
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay.storage.formats.package_values import PACKAGE_EXCEPTION_NAMES, PACKAGE_EXCEPTIONS
from flink_agents_replay.storage.formats.plain import dump_user, load_user

__all__ = ["PACKAGE_EXCEPTIONS", "PACKAGE_EXCEPTION_NAMES", "exception_from_plain", "exception_to_plain"]


def exception_to_plain(encoded: BaseException | dict[str, Any]) -> dict[str, Any]:
    """The plain form of an exception, or of the parts ``encode_exception`` made of one."""
    if isinstance(encoded, BaseException):
        name = PACKAGE_EXCEPTION_NAMES.get(type(encoded))
        if name is None:
            return {"pickled": dump_user(encoded, what=f"a raised {type(encoded).__name__}")}
        return {"package": name, "args": dump_user(encoded.args), "attributes": dump_user(vars(encoded))}
    kind = encoded["type"]
    return {"rebuilt": PACKAGE_EXCEPTION_NAMES.get(kind) or dump_user(kind), "args": dump_user(encoded["args"]),
            "attributes": dump_user(encoded["attributes"]), "dropped": list(encoded["dropped"])}


def exception_from_plain(plain: dict[str, Any]) -> BaseException | dict[str, Any]:
    """What :func:`exception_to_plain` was given (an exception, or the parts, as ``decode_exception`` takes them)."""
    if "pickled" in plain:
        return load_user(plain["pickled"])
    if "package" in plain:
        kind = PACKAGE_EXCEPTIONS[plain["package"]]
        exc = kind.__new__(kind)
        exc.args = tuple(load_user(plain["args"]))
        exc.__dict__.update(load_user(plain["attributes"]))
        return exc
    rebuilt = plain["rebuilt"]
    kind = PACKAGE_EXCEPTIONS[rebuilt] if isinstance(rebuilt, str) else load_user(rebuilt)
    return {"type": kind, "args": tuple(load_user(plain["args"])), "attributes": load_user(plain["attributes"]),
            "dropped": list(plain["dropped"])}
