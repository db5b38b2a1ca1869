"""Flink's key groups, computed in Python exactly as the JVM computes them.

Flink hashes every key into one of ``max_parallelism`` *key groups* and gives each parallel subtask a
contiguous range of them. The journal has one Kafka partition per key group, so the operator must know,
for a key, the key group Flink itself chose, and for a subtask, the key groups it owns. Both are
computed here without a JVM:

* ``key_group = murmur(javaHashCode(javaKey)) % max_parallelism``, where ``murmur`` is Flink's
  ``MathUtils.murmurHash`` (one murmur3_32 block, seed 0, made non-negative).
* In PyFlink the Java key is **not** the user's key: ``key_by(f, key_type=...)`` wraps it in a one-field
  ``org.apache.flink.types.Row`` whose ``hashCode`` is ``31 * (31 * 1 + kind) + fieldHash`` folded to
  ``62 + fieldHash`` (int32 arithmetic). Forgetting the wrapper puts about three keys in four in the
  wrong group.

Only keys declared with ``Types.STRING()``, ``Types.LONG()`` or ``Types.INT()`` have a canonical Java
form. Keys without a ``key_type`` reach Java as pickled bytes whose encoding differs between PyFlink's
execution modes, so their key group cannot be reproduced: :func:`key_group` refuses them.
"""

from __future__ import annotations

import mmh3

__all__ = [
    "JAVA_KEY_TYPES",
    "SUPPORTED_KEY_TYPES",
    "UnsupportedKeyTypeError",
    "flink_key_type",
    "java_hash_code",
    "key_type_name",
    "key_group",
    "key_group_range",
    "murmur_hash",
    "operator_index_for_key_group",
]

#: Names of the PyFlink key types whose key groups this module reproduces.
SUPPORTED_KEY_TYPES = ("STRING", "LONG", "INT")
#: The supported key types by the name of their Java class (what a PyFlink ``KeyedStream`` reports).
JAVA_KEY_TYPES = {"String": "STRING", "Long": "LONG", "Integer": "INT"}

_ROW_HASH_BASE = 62  # Row.hashCode() of a one-field INSERT row: 31 * (31 * 1 + RowKind.INSERT=0) + h
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class UnsupportedKeyTypeError(TypeError):
    """A key (or key type) whose Flink key group cannot be computed in Python."""


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def _string_hash(text: str) -> int:
    # Java hashes UTF-16 code units: a character outside the BMP counts as its surrogate pair.
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return _to_int32(h)


def java_hash_code(key: object, key_type: str) -> int:
    """Return ``hashCode()`` of the Java value PyFlink builds for ``key`` of ``key_type``.

    ``key_type`` is ``"STRING"``, ``"LONG"`` or ``"INT"`` (the name of the PyFlink type). The result is
    the hash of the key itself, without the ``Row`` wrapper.
    """
    kind = key_type_name(key_type)
    if kind == "STRING":
        if not isinstance(key, str):
            raise UnsupportedKeyTypeError(f"a STRING key must be str, got {type(key).__name__}: {key!r}")
        return _string_hash(key)
    if isinstance(key, bool) or not isinstance(key, int):
        raise UnsupportedKeyTypeError(f"a {kind} key must be int, got {type(key).__name__}: {key!r}")
    if kind == "LONG":
        if not _LONG_MIN <= key <= _LONG_MAX:
            raise UnsupportedKeyTypeError(f"LONG key {key} is outside the signed 64-bit range")
        unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
        return _to_int32(unsigned ^ (unsigned >> 32))
    if not _INT_MIN <= key <= _INT_MAX:
        raise UnsupportedKeyTypeError(f"INT key {key} is outside the signed 32-bit range")
    return key


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: non-negative murmur3_32 of one little-endian int."""
    h = mmh3.hash(_to_int32(code).to_bytes(4, "little", signed=True), 0, signed=True)
    if h >= 0:
        return h
    return 0 if h == _INT_MIN else -h


def key_group(key: object, key_type: str, max_parallelism: int) -> int:
    """Return the key group Flink assigns to ``key`` declared with ``key_by(..., key_type=...)``.

    >>> key_group("order-17", "STRING", 128)  # doctest: +SKIP
    """
    _check_max_parallelism(max_parallelism)
    row_hash = _to_int32(_ROW_HASH_BASE + java_hash_code(key, key_type))
    return murmur_hash(row_hash) % max_parallelism


def key_group_range(subtask_index: int, parallelism: int, max_parallelism: int) -> range:
    """Return the key groups subtask ``subtask_index`` of ``parallelism`` owns, as a ``range``."""
    _check_max_parallelism(max_parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism must be between 1 and max parallelism {max_parallelism}, got {parallelism}")
    if not 0 <= subtask_index < parallelism:
        raise ValueError(f"subtask index must be between 0 and {parallelism - 1}, got {subtask_index}")
    start = (subtask_index * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask_index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def operator_index_for_key_group(group: int, parallelism: int, max_parallelism: int) -> int:
    """Return the subtask that owns key group ``group`` (Flink's ``computeOperatorIndexForKeyGroup``)."""
    if not 0 <= group < max_parallelism:
        raise ValueError(f"key group must be between 0 and {max_parallelism - 1}, got {group}")
    return group * parallelism // max_parallelism


def key_type_name(key_type: object) -> str:
    """Return ``"STRING"``, ``"LONG"`` or ``"INT"`` for a type name or a PyFlink ``Types.X()`` value.

    Anything else raises :class:`UnsupportedKeyTypeError` with the fix in its message.
    """
    if isinstance(key_type, str):
        name = key_type.upper()
    else:
        # A PyFlink BasicTypeInfo carries a BasicType enum; read it without importing PyFlink.
        basic_type = getattr(key_type, "_basic_type", None)
        name = getattr(basic_type, "name", None) or repr(key_type)
    if name not in SUPPORTED_KEY_TYPES:
        raise UnsupportedKeyTypeError(
            f"key type {key_type!r} is not supported: declare the key with key_by(..., key_type=Types.STRING()), "
            "Types.LONG() or Types.INT(); other keys have no canonical Java form, so their Flink key group "
            "(and journal partition) cannot be computed"
        )
    return name


def flink_key_type(name: str):
    """The PyFlink ``TypeInformation`` of a supported key type name (``Types.STRING()``...)."""
    from pyflink.common import Types  # only where a job is built: the rest of this module is PyFlink-free

    return getattr(Types, key_type_name(name))()


def _check_max_parallelism(max_parallelism: int) -> None:
    if not 1 <= max_parallelism <= 32768:
        raise ValueError(f"max parallelism must be between 1 and 32768 (Flink's limit), got {max_parallelism}")
