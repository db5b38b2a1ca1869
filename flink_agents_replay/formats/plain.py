"""Plain data on disk: msgpack for the package's own structure, cloudpickle only for the user's values.

Everything this package persists is a *plain* structure — dicts with string keys, lists, strings, numbers,
booleans, ``None`` and bytes — packed with msgpack. Unpacking it runs no code and names no class, so a
record written by one version of this package reads in another, whatever its modules are called then.

The user's values (memory values, event fields, tool results, business keys, inputs and outputs, the
user's own exceptions) are the exception: they are whatever Python objects the agent uses, so they are
kept as cloudpickled bytes inside the plain structure (:func:`dump_user`, :func:`load_user`). Each schema
says which of its fields hold such bytes; nothing else is ever unpickled. The package's own objects inside
them (a ``ChatResult`` kept in memory) are written with their class's persisted name, not its module path
(:mod:`flink_agents_replay.formats.package_values`).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import cloudpickle
import msgpack

from flink_agents_replay.errors import NotPicklableError, SignatureError
from flink_agents_replay.formats.package_values import (
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
    """An exception pickle's default could not rebuild, rebuilt without its constructor instead:
    ``type.__new__(type, *args)`` (which sets ``args``), then its attributes, as ``copy`` does. The default
    calls ``type(*exc.args)`` at load, which fails for the many constructors taking keyword-only or other
    arguments than they store (a ``RefundError(order=..., amount=...)`` kept in memory). Built-in exceptions,
    those that reduce themselves and those whose constructor takes their ``args`` pickle as they always did
    (a constructor may set fields ``__new__`` does not: ``UnicodeDecodeError.start``)."""
    kind = type(exc)
    if kind.__module__ == "builtins" or kind.__reduce__ is not BaseException.__reduce__ or (
            kind.__reduce_ex__ is not object.__reduce_ex__) or _constructor_takes_args(kind, exc.args):
        return _cloudpickle_reducer(pickler, exc)
    return copyreg.__newobj__, (kind, *exc.args), exc.__dict__ or None


def _constructor_takes_args(kind: type, args: tuple) -> bool:
    """Whether ``kind(*args)`` makes an exception, as pickle's default rebuild will."""
    try:
        kind(*args)
    except Exception:  # noqa: BLE001 - a TypeError for the signature, or whatever the constructor raises
        return False
    return True


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
