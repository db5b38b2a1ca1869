"""This package's objects inside a user's values, kept under their public name, never under a module path.

Users keep what the package hands them: a ``ChatResult`` in memory, a ``ToolLoopResult`` sent as an output, an
``InputEvent`` in a list, a caught ``ChatModelError``. Pickled as they are, these objects would be named by the
module that defines them (``flink_agents_replay.records.chat.ChatResult``), and a later version that moved the
class could not read the user's savepoints and journals. So the user-value pickler
(:func:`flink_agents_replay.formats.plain.dump_user`) writes each as a pickle *persistent id*, plain data::

    ["flink-agents-replay", <form>, <name>, <state>]

* ``object``: a class the package exports (``flink_agents_replay.<name>``), its state the instance's attributes;
* ``enum``: a member of an exported enum (``SideEffects.EXTERNAL``), its state the member's name;
* ``exception``: one of the package's exceptions, by its name in
  :data:`~flink_agents_replay.formats.exceptions.PACKAGE_EXCEPTIONS`, its state ``[args, attributes]``.

The state is pickled with the rest of the value: it may hold the user's objects and other package objects.
Reading resolves the name through the package's public API, whatever module defines the class then, and
rebuilds the object without calling its constructor (as pickle does).

The demo's agent, the testing API and the local services (``examples``, ``testing``, ``local``) are user code
shipped with the package: their classes pickle by reference, as a user's own do.

Limits: a package object the value refers to twice comes back as two equal objects; a package object that has
no public name (an internal class: a vector-store filter, a resource) is refused with
:class:`~flink_agents_replay.errors.NotPicklableError`: keep its fields instead.
"""

from __future__ import annotations

import copyreg
import enum
import importlib
import sys
from typing import Any

from flink_agents_replay.errors import NotPicklableError, SignatureError

__all__ = ["is_package_class", "package_object_id", "package_object_from_id"]

_TAG = "flink-agents-replay"
_PACKAGE = __name__.split(".")[0]
_is_package: dict[type, bool] = {}
_public_names: dict[type, str | None] = {}


#: Modules of the package that hold *user* code as a user would write it (the demo's agent, the testing API's
#: agents and events, the local services): their classes pickle like any user class, by reference.
_USER_CODE = tuple(f"{_PACKAGE}.{name}." for name in ("examples", "testing", "local"))


def is_package_class(kind: type) -> bool:
    """Whether ``kind`` is defined in this package's product code (memoized: asked of every object a user value
    holds that is not builtin data)."""
    known = _is_package.get(kind)
    if known is None:  # first sight of the class
        module = getattr(kind, "__module__", None) or ""
        known = module.split(".")[0] == _PACKAGE and not (module + ".").startswith(_USER_CODE)
        _is_package[kind] = known
    return known


def package_object_id(obj: Any) -> list[Any] | None:
    """The persistent id of a package object (``None`` for any other object); refuses one without a public name."""
    kind = type(obj)
    if not is_package_class(kind):
        return None
    if isinstance(obj, BaseException):
        return [_TAG, "exception", _exception_name(kind), [list(obj.args), dict(vars(obj))]]
    name = _public_name(kind)
    if isinstance(obj, enum.Enum):
        return [_TAG, "enum", name, obj.name]
    return [_TAG, "object", name, _attributes(obj)]


def package_object_from_id(pid: Any) -> Any:
    """The object :func:`package_object_id` named."""
    if not (isinstance(pid, list) and len(pid) == 4 and pid[0] == _TAG):
        raise SignatureError(f"a value names an object this version does not know how to read: {pid!r:.200}")
    _, form, name, state = pid
    kind = _resolve(form, name)
    if form == "enum":
        return kind[state]
    obj = kind.__new__(kind)
    if form == "exception":
        args, attributes = state
        obj.args = tuple(args)
        obj.__dict__.update(attributes)
        return obj
    for attribute, value in state.items():
        object.__setattr__(obj, attribute, value)  # frozen dataclasses and __slots__ included
    return obj


def _public_name(kind: type) -> str:
    """The name ``kind`` is exported under at the package's top level."""
    if kind not in _public_names:
        package = sys.modules[_PACKAGE]
        name = kind.__name__
        exported = name in getattr(package, "__all__", ()) and getattr(package, name, None) is kind
        _public_names[kind] = name if exported else None
    name = _public_names[kind]
    if name is None:
        raise NotPicklableError(
            f"holds a {kind.__qualname__}, an internal object of flink-agents-replay that is not kept in user "
            "values (a later version may change it): keep its fields (plain data) instead")
    return name


def _exception_name(kind: type) -> str:
    from flink_agents_replay.formats.exceptions import PACKAGE_EXCEPTION_NAMES

    name = PACKAGE_EXCEPTION_NAMES.get(kind)
    if name is None:
        raise NotPicklableError(f"holds a {kind.__qualname__}, an exception of flink-agents-replay without a "
                                "persisted name: keep str(exc) instead")
    return name


def _resolve(form: str, name: str) -> Any:
    if form == "exception":
        from flink_agents_replay.formats.exceptions import PACKAGE_EXCEPTIONS

        kind = PACKAGE_EXCEPTIONS.get(name)
    else:
        package = importlib.import_module(_PACKAGE)
        kind = getattr(package, name, None) if name in package.__all__ else None
    if not isinstance(kind, type) or form not in ("object", "enum", "exception"):
        raise SignatureError(f"a value holds a {name} ({form}) of flink-agents-replay that this version does not "
                             "have: upgrade flink-agents-replay")
    return kind


def _attributes(obj: Any) -> dict[str, Any]:
    """The instance's attributes and the values of its slots, as pickle finds them."""
    attributes = dict(getattr(obj, "__dict__", {}))
    for name in copyreg._slotnames(type(obj)):  # noqa: SLF001 - the slot names of the class and its bases
        if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
            attributes[name] = getattr(obj, name)
    return attributes
