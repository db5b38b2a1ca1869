"""The journal's record envelope: versioned, signed, with a cloudpickle payload.

Layout of a record value::

    b"FARJ" | version (1 byte) | header length (4 bytes, big endian) | header (JSON) | payload | HMAC (32 bytes)

The header says what the record is (kind, producer, action fingerprint, creation time) without
unpickling anything. The HMAC-SHA256 covers the Kafka record key and everything before it, with a key
only the job knows: a record that fails verification — written under another key, moved to another
Kafka key, or by another job (``producer``) — is rejected *before* its payload is unpickled, so whoever
can write to the topic cannot make the job unpickle arbitrary bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import time
from dataclasses import dataclass
from typing import Any

import cloudpickle

from flink_agents_replay.errors import NotPicklableError, SignatureError
from flink_agents_replay.journal.records import RecordKind

__all__ = ["FORMAT_VERSION", "DecodedRecord", "RecordCodec"]

FORMAT_VERSION = 1
_MAGIC = b"FARJ"
_PREFIX = struct.Struct(">4sBI")
_MAC_SIZE = 32


@dataclass(frozen=True)
class DecodedRecord:
    """A verified record: its header fields and unpickled payload."""

    kind: RecordKind
    producer: str
    fingerprint: str
    created_at: float
    payload: Any


class RecordCodec:
    """Encodes and verifies journal records for one producer (an agent's operator).

    Args:
        signing_key: the HMAC key (at least 16 bytes); the same for every run of the job.
        producer: identity of the writer (the operator's uid); records of other producers are rejected.
    """

    def __init__(self, signing_key: bytes, producer: str):
        if len(signing_key) < 16:
            raise ValueError("the journal signing key must be at least 16 bytes")
        self._key = signing_key
        self.producer = producer

    def encode(self, record_key: bytes, kind: RecordKind, payload: Any, *, fingerprint: str = "",
               what: str = "journal record") -> bytes:
        """Serialize and sign ``payload``; ``what`` names it in a :class:`NotPicklableError`."""
        try:
            body = cloudpickle.dumps(payload)
        except Exception as exc:  # noqa: BLE001 - pickling raises many types
            raise NotPicklableError(f"{what} cannot be serialized with cloudpickle: {exc}") from exc
        header = json.dumps(
            {"kind": kind.value, "producer": self.producer, "fp": fingerprint, "ts": round(time.time(), 3)},
            separators=(",", ":"),
        ).encode()
        unsigned = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header + body
        return unsigned + self._mac(record_key, unsigned)

    def decode(self, record_key: bytes, value: bytes, *, where: str = "") -> DecodedRecord:
        """Verify and decode a record value; raise :class:`SignatureError` if it is not ours."""
        header, body = self.verify(record_key, value, where=where)
        return DecodedRecord(RecordKind(header["kind"]), header["producer"], header["fp"], header["ts"],
                             cloudpickle.loads(body))

    def verify(self, record_key: bytes, value: bytes, *, where: str = "") -> tuple[dict, bytes]:
        """Check a record's signature and producer; return its header and its still-pickled payload.

        Recovery verifies every record as it reads it but unpickles a key's payloads only when that key
        replays: unpickling is most of the cost of reading the journal back.
        """
        context = f" ({where})" if where else ""
        if value is None or len(value) < _PREFIX.size + _MAC_SIZE:
            raise SignatureError(f"journal record{context} is too short to be a flink-agents-replay record")
        magic, version, header_length = _PREFIX.unpack_from(value)
        if magic != _MAGIC:
            raise SignatureError(f"journal record{context} is not a flink-agents-replay record (bad magic)")
        if version != FORMAT_VERSION:
            raise SignatureError(
                f"journal record{context} has format version {version}; this version reads {FORMAT_VERSION}"
            )
        unsigned, mac = value[:-_MAC_SIZE], value[-_MAC_SIZE:]
        if not hmac.compare_digest(mac, self._mac(record_key, unsigned)):
            raise SignatureError(
                f"journal record{context} failed signature verification: it was written with another signing "
                "key or altered. Check that the job uses the same signing key as the job that wrote the topic "
                "(FLINK_AGENTS_REPLAY_SIGNING_KEY), and that nothing else writes to the journal topic"
            )
        start = _PREFIX.size
        header = json.loads(unsigned[start:start + header_length])
        if header["producer"] != self.producer:
            raise SignatureError(
                f"journal record{context} was written by {header['producer']!r}, not by this operator "
                f"({self.producer!r}): each agent needs its own journal topic"
            )
        return header, unsigned[start + header_length:]

    @staticmethod
    def peek_header(value: bytes) -> dict | None:
        """The record's header (kind, producer, fingerprint, time) *without* verifying it: for display only.

        Returns ``None`` for bytes that are not a record of this format. Never unpickles anything.
        """
        if value is None or len(value) < _PREFIX.size + _MAC_SIZE:
            return None
        magic, version, header_length = _PREFIX.unpack_from(value)
        if magic != _MAGIC or version != FORMAT_VERSION:
            return None
        try:
            return json.loads(value[_PREFIX.size:_PREFIX.size + header_length])
        except ValueError:
            return None

    def _mac(self, record_key: bytes, unsigned: bytes) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        mac.update(struct.pack(">I", len(record_key)))
        mac.update(record_key)
        mac.update(unsigned)
        return mac.digest()
