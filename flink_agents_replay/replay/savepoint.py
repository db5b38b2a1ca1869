"""What a replay needs to know about a savepoint before it starts: its checkpoint id and whose state it holds.

Flink writes a savepoint's ``_metadata`` as: magic number ``0x4960672d`` (4 bytes), format version
(4 bytes), checkpoint id (8 bytes, big endian), then the operator states, each under its 16-byte operator
id. An operator with a uid has the id murmur3-128 (seed 0) of the uid, so the uid's bytes show whether
the savepoint holds that operator's state without a Flink client (read, not parsed: only these two facts
are used, and a wrong file is refused).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import mmh3

from flink_agents_replay.core.errors import ReplayConfigError

__all__ = ["SavepointInfo", "operator_id", "read_savepoint"]

_MAGIC = 0x4960672D
_HEADER = struct.Struct(">iiq")


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint's directory, checkpoint id and format version."""

    path: Path
    checkpoint_id: int
    version: int
    _metadata: bytes

    def holds_operator(self, uid: str) -> bool:
        """Whether the savepoint holds state of the operator with ``uid``."""
        return operator_id(uid) in self._metadata


def operator_id(uid: str) -> bytes:
    """Flink's 16-byte operator id of an operator given ``uid`` (``StreamGraphHasherV2``: murmur3-128, seed 0)."""
    return mmh3.hash_bytes(uid.encode(), 0, True)


def read_savepoint(path: str | Path) -> SavepointInfo:
    """Read the checkpoint id of the savepoint at ``path`` (its directory, its ``_metadata`` or a ``file:`` URI)."""
    text = str(path)
    if text.startswith("file:"):  # the URI Flink prints: file:/dir, file:///dir, file://localhost/dir
        text = unquote(urlparse(text).path)
    location = Path(text)
    metadata_file = location / "_metadata" if location.is_dir() else location
    try:
        metadata = metadata_file.read_bytes()
    except OSError as exc:
        raise ReplayConfigError(f"cannot read the savepoint's metadata {metadata_file}: {exc.strerror or exc}; "
                                "give the savepoint directory that `flink savepoint` / `flink stop` printed") from None
    if len(metadata) < _HEADER.size:
        raise ReplayConfigError(f"{metadata_file} is not a Flink savepoint's _metadata (too short)")
    magic, version, checkpoint_id = _HEADER.unpack_from(metadata)
    if magic != _MAGIC:
        raise ReplayConfigError(f"{metadata_file} is not a Flink savepoint's _metadata (magic number {magic:#x})")
    return SavepointInfo(metadata_file.parent, checkpoint_id, version, metadata)
