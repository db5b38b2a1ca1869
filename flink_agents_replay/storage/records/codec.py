"""The journal's record envelope: versioned, signed, with a plain-data payload.

Layout of a record value::

    b"FARJ" | version (1 byte) | header length (4 bytes, big endian) | header (JSON) | payload | HMAC (32 bytes)

The payload is the record as plain data (msgpack), by the schema of its kind (:mod:`.schemas` for the
journal, :mod:`flink_agents_replay.storage.capture.schemas` for the capture); only the user's values inside it are
pickled (see :mod:`flink_agents_replay.storage.formats`). Envelope version 3 is written; versions 2 (0.2.0) and 1
(0.1.0, whose payload was a cloudpickle of the package's classes, read by
:mod:`flink_agents_replay.storage.formats.legacy`) are still read.

The header says what the record is (kind, producer, action fingerprint, creation time) without
unpickling anything. A record that fails verification is rejected *before* its payload is unpickled, so
whoever can write to the topic cannot make the job unpickle arbitrary bytes.

What the HMAC-SHA256 binds
--------------------------
Version 3 signs, besides every byte before the MAC, *where the record belongs*: the topic name, the
partition and the Kafka record key. A valid record copied anywhere else fails: into another partition,
under another key, or into another topic written with the same key and producer (a replay's journal into
production's, a replay's capture into production's capture). A record the reader can only get as a value
(capture records through Flink's ``KafkaSource``) is signed with ``partition=None`` and a fixed key; the
capture binds its key group inside the signed payload instead (:mod:`flink_agents_replay.storage.capture`).
Independently of the MAC, a journal record's key must start with the partition it is read from (its key
group, :func:`flink_agents_replay.storage.records.journal.journal_key`): that check binds 0.1.0/0.2.0 records to
their partition too, since their MAC covered the key.

Compatibility window: versions 1 and 2 keep verifying under their own scheme (the key and the bytes, not
the topic), so the checked-in fixtures and journals written before the upgrade restore. The cost: someone
who can write to the topics can still copy such an *old* record into another topic of the same producer
and key. A journal holds old records only until the checkpoints after the upgrade prune them, and a
capture only for its retention; the window closes when the versions are dropped from
:data:`READABLE_VERSIONS` (a later release; the operations guide says when).

A journal moved with ``flink-agents-replay journal load`` (:mod:`flink_agents_replay.storage.journal.transfer`)
under its own name verifies as it is. Loaded under another name, its version 3 records are re-signed for
the new name by :meth:`SigningKeys.resign`, which first verifies each against its old name: the reader
trusts only its config and the key, never a note carried by the topic itself (whoever can write the topic
could forge it), and topic ids change with every move.

Key rotation
------------
Records are signed with the first key and verified with any of :class:`SigningKeys`'s keys
(``AgentConfig(signing_key=..., verification_keys=[...])``). To rotate:

1. Deploy with the new key as ``signing_key`` and the old one in ``verification_keys`` (stop with a
   savepoint, restart from it): records written from then on carry the new key, older ones still verify.
2. Keep the old key listed while anything signed with it can still be read: the journal until a
   checkpoint after the restart has completed (pruning removes older records) and every savepoint taken
   before you may restore has been retired; the capture for its retention (or as long as you replay its
   older traffic).
3. Remove the old key from ``verification_keys`` and redeploy. A record signed with a key in neither place
   is rejected (:class:`~flink_agents_replay.core.errors.SignatureError`).
"""

from __future__ import annotations

import functools
import hmac
import json
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.core.errors import NotPicklableError, SignatureError
from flink_agents_replay.core.events import EventTypes
from flink_agents_replay.storage.formats.legacy import load_v1
from flink_agents_replay.storage.formats.plain import pack, unpack
from flink_agents_replay.storage.formats.schema import RecordSchema
from flink_agents_replay.storage.records.schemas import JOURNAL_SCHEMAS

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "DecodedRecord", "RecordCodec", "SigningKeys"]

FORMAT_VERSION = 3
#: Envelope versions this version reads: 1 is 0.1.0's pickled payloads, 2 is 0.2.0's (MAC over the key only).
READABLE_VERSIONS = (1, 2, 3)
#: Versions whose MAC binds the topic and partition too.
_BOUND_VERSIONS = (3,)
_MAGIC = b"FARJ"
#: What capture records are signed with in place of their Kafka record key: a replay reads them through
#: Flink's KafkaSource, which hands over only the value (the payload carries what identifies the record).
CAPTURE_SIGNED_KEY = b"flink-agents-replay/capture"
_PREFIX = struct.Struct(">4sBI")
_MAC_SIZE = 32
#: The partition a record is signed for when its reader cannot know it (capture records via KafkaSource).
_UNBOUND_PARTITION = -1
_MIN_KEY_BYTES = 16


def _check_key(key: bytes, what: str) -> bytes:
    if not isinstance(key, bytes) or len(key) < _MIN_KEY_BYTES:
        raise ValueError(f"the {what} must be at least {_MIN_KEY_BYTES} bytes")
    return key


class SigningKeys:
    """The HMAC keys of a job: the first signs, every one verifies (key rotation, see the module docstring).

    Args:
        signing_key: the key new records are signed with (at least 16 bytes).
        verification_keys: older keys whose records are still accepted.
    """

    def __init__(self, signing_key: bytes, *, verification_keys: Iterable[bytes] = ()):
        self._signing = _check_key(signing_key, "journal signing key")
        older = [_check_key(key, "verification key") for key in verification_keys]
        self._all = (self._signing, *(key for key in older if key != self._signing))
        # Keyed once: a copy per record skips the key set-up (about a third of an HMAC of a small record).
        self._keyed = {key: hmac.new(key, digestmod="sha256") for key in self._all}

    def sign(self, version: int, unsigned: bytes, *, topic: str, partition: int | None, record_key: bytes) -> bytes:
        """The MAC of ``unsigned`` (an envelope without its MAC) under the signing key."""
        return _mac(self._keyed[self._signing], version, unsigned, topic=topic, partition=partition,
                    record_key=record_key)

    def verifies(self, value: bytes, *, topic: str, partition: int | None, record_key: bytes) -> bool:
        """Whether ``value`` (a whole envelope) carries a MAC of one of the keys for this place."""
        version = value[len(_MAGIC)]
        unsigned, mac = value[:-_MAC_SIZE], value[-_MAC_SIZE:]
        return any(hmac.compare_digest(mac, _mac(self._keyed[key], version, unsigned, topic=topic,
                                                 partition=partition, record_key=record_key)) for key in self._all)

    def resign(self, value: bytes, *, record_key: bytes, from_topic: str, to_topic: str, partition: int) -> bytes:
        """``value`` signed for ``to_topic`` instead of ``from_topic`` (a journal or capture moved under another
        name); it must verify for ``from_topic`` first (:class:`SignatureError` otherwise).

        Records of versions 1 and 2 (not bound to a topic) and bytes that are not a record come back
        unchanged. A journal record is signed for its partition; a capture record (fixed key, no partition)
        is recognised by verifying without one.
        """
        if signed_version(value) not in _BOUND_VERSIONS:
            return value
        unsigned = value[:-_MAC_SIZE]
        # A journal record is signed for its Kafka key and partition; a capture record for CAPTURE_SIGNED_KEY.
        for signed_key, bound_partition in ((record_key, partition), (record_key, None), (CAPTURE_SIGNED_KEY, None)):
            if self.verifies(value, topic=from_topic, partition=bound_partition, record_key=signed_key):
                return unsigned + self.sign(FORMAT_VERSION, unsigned, topic=to_topic, partition=bound_partition,
                                            record_key=signed_key)
        raise SignatureError(f"record at partition {partition} (key {record_key!r:.60}) of topic {from_topic!r} "
                             "does not verify with the given keys for that topic: not re-signed")


def signed_version(value: bytes | None) -> int | None:
    """The envelope version of a record of this format, or ``None`` for other bytes."""
    if value is None or len(value) < _PREFIX.size + _MAC_SIZE or value[:len(_MAGIC)] != _MAGIC:
        return None
    return value[len(_MAGIC)]


def _mac(keyed: hmac.HMAC, version: int, unsigned: bytes, *, topic: str, partition: int | None,
         record_key: bytes) -> bytes:
    # Length-prefixed, so no (topic, key) pair can be re-cut into another with the same bytes.
    key_part = struct.pack(">I", len(record_key)) + record_key
    if version in _BOUND_VERSIONS:
        place = _topic_part(topic) + struct.pack(">i", _UNBOUND_PARTITION if partition is None else partition)
        key_part = place + key_part
    mac = keyed.copy()
    mac.update(key_part + unsigned)  # one update: the same MAC as the parts one by one
    return mac.digest()


def encode_header(kind: str, producer: str, fingerprint: str, created_at: float, attempt: int) -> bytes:
    """The header's JSON, byte for byte ``json.dumps`` of it with ``separators=(",", ":")``, built from cached
    pieces: kinds, producers and fingerprints are few, and a header is written for every record."""
    return b'{"kind":%s,"producer":%s,"fp":%s,"ts":%s,"att":%d}' % (
        _json_string(kind), _json_string(producer), _json_string(fingerprint), float.__repr__(created_at).encode(),
        attempt)


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    return json.dumps(text).encode()


@functools.lru_cache(maxsize=64)
def _topic_part(topic: str) -> bytes:
    encoded = topic.encode("utf-8")
    return struct.pack(">I", len(encoded)) + encoded


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

    Every record is signed for, and verified against, the place it is stored: ``topic`` (its name),
    ``partition`` and the Kafka record key (see the module docstring).

    Args:
        signing_key: the HMAC key new records are signed with (at least 16 bytes); the same for every run
            of the job, until it is rotated.
        producer: identity of the writer (the operator's uid); records of other producers are rejected.
        verification_keys: older signing keys whose records are still accepted (key rotation).
        schemas: the record kinds this codec writes and reads (default: the journal's).
        event_types: resolves the names of persisted events (default: every event class defined).
    """

    def __init__(self, signing_key: bytes, producer: str, *, verification_keys: Iterable[bytes] = (),
                 schemas: dict[str, RecordSchema] | None = None, event_types: EventTypes | None = None):
        self.keys = SigningKeys(signing_key, verification_keys=verification_keys)
        self.producer = producer
        self._schemas = JOURNAL_SCHEMAS if schemas is None else schemas
        self._event_types = event_types or EventTypes()

    def encode(self, record_key: bytes, kind: str, payload: Any, *, topic: str, partition: int | None,
               fingerprint: str = "", what: str = "journal record", attempt: int = 0) -> bytes:
        """Serialize ``payload`` (a record of ``kind``) and sign it for ``topic``, ``partition`` and ``record_key``
        (``partition=None``: for a reader that gets only the value); ``what`` names it in a
        :class:`NotPicklableError`.

        ``attempt``: the writer's attempt number in the record's partition, header ``att`` (readers take
        ``header.get("att", 0)``: earlier records have none); see :mod:`flink_agents_replay.storage.journal.fencing`."""
        kind = getattr(kind, "value", kind)
        schema = self._schemas.get(kind)
        if schema is None:
            raise ValueError(f"no schema for record kind {kind!r} (known: {sorted(self._schemas)})")
        try:
            body = pack({"v": schema.version, **schema.to_plain(payload)})
        except NotPicklableError as exc:
            raise NotPicklableError(f"{what}: {exc}") from exc
        header = encode_header(kind, self.producer, fingerprint, round(time.time(), 3), attempt)
        unsigned = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header + body
        return unsigned + self.keys.sign(FORMAT_VERSION, unsigned, topic=topic, partition=partition,
                                         record_key=record_key)

    def decode(self, record_key: bytes, value: bytes, *, topic: str, partition: int | None,
               where: str = "") -> DecodedRecord:
        """Verify and decode a record value read from ``topic``/``partition``; raise :class:`SignatureError` if it
        is not ours or not in its place."""
        header, body = self.verify(record_key, value, topic=topic, partition=partition, where=where)
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

    def verify(self, record_key: bytes, value: bytes, *, topic: str, partition: int | None,
               where: str = "") -> tuple[dict, bytes]:
        """Check a record's signature for its place (``topic``, ``partition``, ``record_key``), its key group and
        its producer; return its header (with the envelope version as ``"format"``) and its still-encoded
        payload, for :meth:`load`.

        With a ``partition``, the record key must start with it (a journal key's key group). Recovery
        verifies every record as it reads it but decodes a key's payloads only when that key replays:
        unpickling the user's values is most of the cost of reading the journal back.
        """
        context = f" ({where})" if where else ""
        version = self._check_envelope(value, context)
        if partition is not None:
            _check_key_group(record_key, partition, context)
        if not self.keys.verifies(value, topic=topic, partition=partition, record_key=record_key):
            raise SignatureError(
                f"journal record{context} failed signature verification: it was written with a key that is "
                "neither the signing key nor one of the verification keys, altered, or copied from another "
                f"topic, partition or record key (it is read from topic {topic!r}). Check that the job uses the "
                "signing key of the job that wrote the topic (FLINK_AGENTS_REPLAY_SIGNING_KEY; an older key "
                "goes in verification_keys), and that nothing else writes to the topic"
            )
        header_length = _PREFIX.unpack_from(value)[2]
        start = _PREFIX.size
        header = json.loads(value[start:start + header_length])
        if header["producer"] != self.producer:
            raise SignatureError(
                f"journal record{context} was written by {header['producer']!r}, not by this operator "
                f"({self.producer!r}): each agent needs its own journal topic"
            )
        header["format"] = version
        return header, value[start + header_length:-_MAC_SIZE]

    @staticmethod
    def _check_envelope(value: bytes, context: str) -> int:
        """The envelope version of ``value``, or :class:`SignatureError` when it is not a record this version reads."""
        if value is None or len(value) < _PREFIX.size + _MAC_SIZE:
            raise SignatureError(f"journal record{context} is too short to be a flink-agents-replay record")
        magic, version, _ = _PREFIX.unpack_from(value)
        if magic != _MAGIC:
            raise SignatureError(f"journal record{context} is not a flink-agents-replay record (bad magic)")
        if version not in READABLE_VERSIONS:
            raise SignatureError(
                f"journal record{context} has format version {version}; this version reads {READABLE_VERSIONS}: "
                "a newer flink-agents-replay wrote it"
            )
        return version

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
            header = json.loads(value[_PREFIX.size:_PREFIX.size + header_length])
        except ValueError:
            return None
        return header if isinstance(header, dict) else None


def _check_key_group(record_key: bytes, partition: int, context: str) -> None:
    """A journal key starts with its key group, which is its partition: a record elsewhere was moved there."""
    group, _, _ = record_key.partition(b":")
    if group != str(partition).encode():
        raise SignatureError(f"journal record{context} has key group {group.decode(errors='replace')!r:.20} in its "
                             f"key but is in partition {partition}: it was copied from another partition (or "
                             "something else writes to the topic)")
