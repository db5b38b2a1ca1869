"""Deterministic sample keys that stress key-group computation: non-ASCII, astral-plane, edge integers."""

from __future__ import annotations

import random

_INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1, 62, -62, 12345]
_LONG_EDGES = [0, 1, -1, 2**63 - 1, -(2**63), 2**63 - 2, -(2**63) + 1, 2**32, -(2**32), 2**31, -(2**31) - 1]
_STRING_EDGES = [
    "", "a", "order-17", "key:with:colons", "ключ", "键值", "Ü", "🦀", "a🦀b", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u0000", "tab\tnew\nline",
    "é" * 40, "🎉" * 17, "x" * 1000,
]
# Pools that mix ASCII, Latin-1, CJK and astral-plane characters (emoji, math letters).
_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz0123456789-_:",
    "äöüßéèêñçøåÆŒ",
    "日本語中文한국어",
    "🦀🎉😀🚀𝔘𝔫𝔦𝕏𝕐𐍈",
]


def sample_string_keys(count: int, seed: int = 7) -> list[str]:
    """Return ``count`` distinct strings: the edge cases first, then random mixed-script strings."""
    rng = random.Random(seed)
    keys = list(dict.fromkeys(_STRING_EDGES))
    seen = set(keys)
    while len(keys) < count:
        alphabet = "".join(rng.sample(_ALPHABETS, rng.randint(1, len(_ALPHABETS))))
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys[:count]


def sample_long_keys(count: int, seed: int = 11) -> list[int]:
    """Return ``count`` distinct signed 64-bit integers, the range's edges first."""
    return _distinct_ints(_LONG_EDGES, 64, count, seed)


def sample_int_keys(count: int, seed: int = 13) -> list[int]:
    """Return ``count`` distinct signed 32-bit integers, the range's edges first."""
    return _distinct_ints(_INT_EDGES, 32, count, seed)


def _distinct_ints(edges: list[int], bits: int, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    keys = dict.fromkeys(edges)
    while len(keys) < count:
        # Mostly full-range values, some small ones (where hash collisions of real ids live).
        wide = rng.random() < 0.7
        keys[rng.randint(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if wide else rng.randint(-10_000, 10_000)] = None
    return list(keys)[:count]
