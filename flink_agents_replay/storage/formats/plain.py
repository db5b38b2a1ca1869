"""Plain data on disk: msgpack for the package's own structure, cloudpickle only for the user's values.

Everything this package persists is a *plain* structure — dicts with string keys, lists, strings, numbers,
booleans, ``None`` and bytes — packed with msgpack. Unpacking it runs no code and names no class, so a
record written by one version of this package reads in another, whatever its modules are called then.

The user's values (memory values, event fields, tool results, business keys, inputs and outputs, the
user's own exceptions) are the exception: they are whatever Python objects the agent uses, so they are
kept as cloudpickled bytes inside the plain structure (:func:`dump_user`, :func:`load_user`). Each schema
says which of its fields hold such bytes; nothing else is ever unpickled. The package's own objects inside
them (a ``ChatResult`` kept in memory) are written with their class's persisted name, not its module path
(:mod:`flink_agents_replay.storage.formats.package_values`).
"""

from __future__ import annotations

import copyreg
import inspect
import io
import pickle
from typing import Any

import cloudpickle
import msgpack

from flink_agents_replay.core.errors import NotPicklableError, SignatureError
from flink_agents_replay.storage.formats.package_values import (
    ORDINARY,
    TAG,
    holds_package_code,
    object_kind,
    package_class_from_id,
    package_class_id,
)

__all__ = ["dump_user", "load_user", "pack", "unpack"]

#: Types that pickle and cloudpickle write the same way (the C pickler never asks cloudpickle about them).
_BUILTIN_SCALARS = frozenset({str, bytes, int, float, bool, complex, type(None)})
_BUILTIN_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
#: How many items a value may hold for the fast path to look at it (beyond: cloudpickle, without looking).
_FAST_PATH_ITEMS = 256


def pack(plain: Any) -> bytes:
    """The msgpack bytes of a plain structure (tuples become lists)."""
    return msgpack.packb(plain, use_bin_type=True)


def unpack(data: bytes, *, what: str = "record") -> Any:
    """The plain structure :func:`pack` wrote; :class:`SignatureError` if the bytes are not one."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise SignatureError(f"{what} does not hold plain data this version reads: {exc}") from exc


def dump_user(value: Any, *, what: str = "value") -> bytes:
    """A user's value as bytes (cloudpickle); :class:`NotPicklableError` naming ``what`` if it cannot be."""
    if _builtin_data(value):  # the common case: the same bytes as cloudpickle's, several times faster
        return pickle.dumps(value, protocol=cloudpickle.DEFAULT_PROTOCOL)
    try:
        try:
            return _dump(_UserPickler, value)
        except _HoldsPackageCode:  # rare: pickled again, asking about every object
            return _dump(_PackageClassPickler, value)
    except NotPicklableError as exc:
        raise NotPicklableError(f"{what} {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        raise NotPicklableError(f"{what} cannot be serialized with cloudpickle: {exc}") from exc


def load_user(data: bytes) -> Any:
    """A user's value from :func:`dump_user`'s bytes (the only place this package unpickles current data)."""
    if _TAG_BYTES in data:  # may name a class of the package (formats.package_values)
        return _UserUnpickler(io.BytesIO(data)).load()
    return pickle.loads(data)


_TAG_BYTES = TAG.encode()


class _HoldsPackageCode(Exception):
    """The value holds a class of this package: it is pickled again, by :class:`_PackageClassPickler`."""


class _UserPickler(cloudpickle.CloudPickler):
    """cloudpickle's pickler, stopping at a class or an instance of this package (asked only of objects that are
    not builtin data, as cloudpickle's own hook is: the common case stays at cloudpickle's speed)."""

    def reducer_override(self, obj: Any) -> Any:
        if object_kind(type(obj)) is not ORDINARY and holds_package_code(obj):
            raise _HoldsPackageCode
        if isinstance(obj, BaseException):
            return _exception_reduce(self, obj)
        return _cloudpickle_reducer(self, obj)  # not super(): this runs for every object that is not builtin data


_cloudpickle_reducer = cloudpickle.CloudPickler.reducer_override


class _PackageClassPickler(cloudpickle.CloudPickler):
    """cloudpickle's pickler writing this package's classes by their persisted name."""

    persistent_id = staticmethod(package_class_id)  # called with every object: no bound method in between

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseException):
            return _exception_reduce(self, obj)
        return _cloudpickle_reducer(self, obj)


def _exception_reduce(pickler: cloudpickle.CloudPickler, exc: BaseException) -> Any:
    """A user's exception rebuilt without its constructor: ``type.__new__(type, *args)`` (which sets ``args``),
    then its attributes (``__dict__`` and ``__slots__``), as ``copy`` does. Pickle's default calls
    ``type(*exc.args)`` at load, which fails for the many constructors taking keyword-only or other arguments
    than they store (a ``RefundError(order=..., amount=...)`` kept in memory), or rebuilds another message.
    Built-in exceptions, those that reduce themselves and those built on a built-in one that keeps fields of its
    own in C (``StopIteration.value``, ``UnicodeDecodeError.start``: set by its constructor only) pickle as they
    always did."""
    kind = type(exc)
    if not _rebuilt_from_attributes(kind):
        _check_constructor_takes_args(kind, exc.args)
        return _cloudpickle_reducer(pickler, exc)
    state = {**exc.__dict__, **{name: getattr(exc, name) for name in _slot_names(kind) if hasattr(exc, name)}}
    return copyreg.__newobj__, (kind, *exc.args), state or None


def _rebuilt_from_attributes(kind: type) -> bool:
    """Whether ``args`` and its attributes are all an exception of ``kind`` holds, and it has pickle's default
    reduce: a class defined in Python on built-in exceptions with no fields beyond ``BaseException``'s."""
    if not _python_class_with_default_reduce(kind):
        return False
    built_in = next(base for base in kind.__mro__ if not base.__flags__ & _HEAP_TYPE)
    return built_in.__basicsize__ == BaseException.__basicsize__


def _check_constructor_takes_args(kind: type, args: tuple) -> None:
    """Refuse now, by name, an exception of a Python class that pickle's default would fail to rebuild at load
    (``kind(*args)``), judged by its signature: no user code runs."""
    if not _python_class_with_default_reduce(kind):
        return
    try:
        signature = inspect.signature(kind)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise NotPicklableError(
            f"holds exception {kind.__qualname__}, which would not load: pickle rebuilds it as "
            f"{kind.__name__}(*args) from its {len(args)} args, which its constructor does not take ({exc}); give "
            "the class a __reduce__, or keep its fields instead of the exception") from None


def _python_class_with_default_reduce(kind: type) -> bool:
    """A class made by a ``class`` statement whose exceptions pickle's default reduce writes."""
    return bool(kind.__flags__ & _HEAP_TYPE) and kind.__reduce__ is BaseException.__reduce__ and (
        kind.__reduce_ex__ is object.__reduce_ex__)


def _slot_names(kind: type) -> list[str]:
    """The ``__slots__`` of ``kind`` and its bases, with private names mangled (as ``copyreg`` lists them)."""
    names = []
    for cls in kind.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            names.append(f"_{cls.__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__")
                         else name)
    return names


#: ``Py_TPFLAGS_HEAPTYPE``: a class made at run time (a ``class`` statement), not a static type of C.
_HEAP_TYPE = 1 << 9


class _UserUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        return package_class_from_id(pid)


def _dump(pickler: type[cloudpickle.CloudPickler], value: Any) -> bytes:
    buffer = io.BytesIO()
    pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()


def _builtin_data(value: Any) -> bool:
    """Whether ``value`` holds builtin scalars and containers only (of those exact types), at most
    :data:`_FAST_PATH_ITEMS` items in all."""
    stack, items = [value], 0
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _BUILTIN_SCALARS:
            continue
        if kind not in _BUILTIN_CONTAINERS:
            return False
        items += len(item)
        if items > _FAST_PATH_ITEMS:
            return False
        if kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            stack.extend(item)
    return True
