"""The local model service's embeddings: a hashed bag of words, so that search over them means something.

Each lower-cased word (letters and digits) adds 1 to the dimension ``murmur3(word) % dimensions`` and
subtracts nothing elsewhere; the vector is then scaled to unit length. Texts sharing words get a cosine
similarity in proportion to what they share, equal texts get equal vectors in any process (no hash seed), and
a text without words gets the zero vector. Good enough for tests and the demo, not a language model.
"""

from __future__ import annotations

import math
import re

import mmh3

__all__ = ["DIMENSIONS", "embed"]

#: Vector size of ``POST /v1/embeddings`` unless the request asks for ``dimensions``.
DIMENSIONS = 256
_WORD = re.compile(r"[^\W_]+")


def embed(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The unit-length hashed bag of words of ``text`` (all zeros for a text without words)."""
    if not 1 <= dimensions <= 4096:
        raise ValueError(f"dimensions must be between 1 and 4096, got {dimensions}")
    counts = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        counts[mmh3.hash(word, signed=False) % dimensions] += 1.0
    norm = math.sqrt(sum(c * c for c in counts))
    return [c / norm for c in counts] if norm else counts
