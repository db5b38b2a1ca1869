"""The journal's record envelope: versioned, signed, with a plain-data payload.

Layout of a record value::

    b"FARJ" | version (1 byte) | header length (4 bytes, big endian) | header (JSON) | payload | HMAC (32 bytes)

The payload is the record as plain data (msgpack), by the schema of its kind (:mod:`.schemas` for the
journal, :mod:`flink_agents_replay.capture.schemas` for the capture); only the user's values inside it are
pickled (see :mod:`flink_agents_replay.formats`). Envelope version 2 is written; version 1 (0.1.0, whose
payload was a cloudpickle of the package's classes) is still read, by :mod:`flink_agents_replay.formats.legacy`.

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

from flink_agents_replay.errors import NotPicklableError, SignatureError
from flink_agents_replay.events import EventTypes
from flink_agents_replay.formats.legacy import load_v1
from flink_agents_replay.formats.plain import pack, unpack
from flink_agents_replay.formats.schema import RecordSchema
from flink_agents_replay.records.schemas import JOURNAL_SCHEMAS

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "DecodedRecord", "RecordCodec"]

FORMAT_VERSION = 2
#: Envelope versions this version reads: 1 is 0.1.0's pickled payloads.
READABLE_VERSIONS = (1, 2)
_MAGIC = b"FARJ"
_PREFIX = struct.Struct(">4sBI")
_MAC_SIZE = 32


@dataclass(frozen=True)
class DecodedRecord:
    """A verified record: its header fields and unpickled payload."""

    kind: str
    producer: str
    fingerprint: str
    created_at: float
    payload: Any


class RecordCodec:
    """Encodes and verifies journal records for one producer (an agent's operator).

    Args:
        signing_key: the HMAC key (at least 16 bytes); the same for every run of the job.
        producer: identity of the writer (the operator's uid); records of other producers are rejected.
        schemas: the record kinds this codec writes and reads (default: the journal's).
        event_types: resolves the names of persisted events (default: every event class defined).
    """

    def __init__(self, signing_key: bytes, producer: str, *, schemas: dict[str, RecordSchema] | None = None,
                 event_types: EventTypes | None = None):
        if len(signing_key) < 16:
            raise ValueError("the journal signing key must be at least 16 bytes")
        self._key = signing_key
        self.producer = producer
        self._schemas = JOURNAL_SCHEMAS if schemas is None else schemas
        self._event_types = event_types or EventTypes()

    def encode(self, record_key: bytes, kind: str, payload: Any, *, fingerprint: str = "",
               what: str = "journal record", attempt: int = 0) -> bytes:
        """Serialize and sign ``payload`` (a record of ``kind``); ``what`` names it in a :class:`NotPicklableError`.

        ``attempt``: the writer's attempt number in the record's partition, header ``att`` (readers take
        ``header.get("att", 0)``: earlier records have none); see :mod:`flink_agents_replay.journal.fencing`."""
        kind = getattr(kind, "value", kind)
        schema = self._schemas.get(kind)
        if schema is None:
            raise ValueError(f"no schema for record kind {kind!r} (known: {sorted(self._schemas)})")
        try:
            body = pack({"v": schema.version, **schema.to_plain(payload)})
        except NotPicklableError as exc:
            raise NotPicklableError(f"{what}: {exc}") from exc
        header = json.dumps(
            {"kind": kind, "producer": self.producer, "fp": fingerprint, "ts": round(time.time(), 3), "att": attempt},
            separators=(",", ":"),
        ).encode()
        unsigned = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header + body
        return unsigned + self._mac(record_key, unsigned)

    def decode(self, record_key: bytes, value: bytes, *, where: str = "") -> DecodedRecord:
        """Verify and decode a record value; raise :class:`SignatureError` if it is not ours."""
        header, body = self.verify(record_key, value, where=where)
        return DecodedRecord(header["kind"], header["producer"], header["fp"], header["ts"],
                             self.load(header, body, where=where))

    def load(self, header: dict, body: bytes, *, where: str = "") -> Any:
        """The record in a payload :meth:`verify` returned (verify first: this unpickles the user's values)."""
        context = f" ({where})" if where else ""
        schema = self._schemas.get(header["kind"])
        if schema is None:
            raise SignatureError(f"journal record{context} is of kind {header['kind']!r}, which this codec does "
                                 "not read")
        if header["format"] == 1:
            record = load_v1(body)
            if schema.legacy_type is not None and not isinstance(record, schema.legacy_type):
                raise SignatureError(f"journal record{context} of kind {header['kind']!r} holds a "
                                     f"{type(record).__name__}")
            return record
        plain = unpack(body, what=f"journal record{context}")
        if not isinstance(plain, dict) or not isinstance(plain.get("v"), int) or plain["v"] > schema.version:
            raise SignatureError(f"journal record{context} of kind {header['kind']!r} has schema version "
                                 f"{plain.get('v') if isinstance(plain, dict) else None!r}; this version reads up "
                                 f"to {schema.version}: upgrade flink-agents-replay")
        return schema.from_plain(plain, self._event_types)

    def verify(self, record_key: bytes, value: bytes, *, where: str = "") -> tuple[dict, bytes]:
        """Check a record's signature and producer; return its header (with the envelope version as
        ``"format"``) and its still-encoded payload, for :meth:`load`.

        Recovery verifies every record as it reads it but decodes a key's payloads only when that key
        replays: unpickling the user's values is most of the cost of reading the journal back.
        """
        context = f" ({where})" if where else ""
        if value is None or len(value) < _PREFIX.size + _MAC_SIZE:
            raise SignatureError(f"journal record{context} is too short to be a flink-agents-replay record")
        magic, version, header_length = _PREFIX.unpack_from(value)
        if magic != _MAGIC:
            raise SignatureError(f"journal record{context} is not a flink-agents-replay record (bad magic)")
        if version not in READABLE_VERSIONS:
            raise SignatureError(
                f"journal record{context} has format version {version}; this version reads {READABLE_VERSIONS}: "
                "a newer flink-agents-replay wrote it"
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
        header["format"] = version
        return header, unsigned[start + header_length:]

    @staticmethod
    def peek_header(value: bytes) -> dict | None:
        """The record's header (kind, producer, fingerprint, time) *without* verifying it: for display only.

        Returns ``None`` for bytes that are not a record of this format. Never decodes the payload.
        """
        if value is None or len(value) < _PREFIX.size + _MAC_SIZE:
            return None
        magic, version, header_length = _PREFIX.unpack_from(value)
        if magic != _MAGIC or version not in READABLE_VERSIONS:
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
