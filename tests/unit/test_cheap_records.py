"""Cheaper records (issue #14) write the same bytes as before: the header as json.dumps wrote it, a user's plain
value as cloudpickle pickled it, and the MAC as the part-by-part HMAC computed it. The checked-in fixtures
(test_persisted_formats, test_compat_fixtures) verify that older records still restore."""

import hashlib
import hmac
import json
import struct
from dataclasses import dataclass

import cloudpickle
import pytest

from flink_agents_replay.formats.plain import dump_user, load_user
from flink_agents_replay.records.codec import SigningKeys, encode_header


@pytest.mark.parametrize("fields", [
    ("call", "agent-x", "0123abcd", 1764700000.123, 0),
    ("completion", 'odd "producer"\\ é ☃', "", 0.5, 7),
    ("accepted", "p", "fp", 1764700000.0, 12),
])
def test_the_header_is_what_json_dumps_wrote(fields):
    kind, producer, fingerprint, created_at, attempt = fields
    expected = json.dumps({"kind": kind, "producer": producer, "fp": fingerprint, "ts": created_at, "att": attempt},
                          separators=(",", ":")).encode()
    assert encode_header(*fields) == expected


@dataclass
class _Point:
    x: int


@pytest.mark.parametrize("value", [
    "x" * 200, b"\x00bytes", 12, 2**70, -1.5, True, None, 1 + 2j, [1, "a", None], (1, (2, 3)),
    {"a": [1, 2, {"b": 1.5}], 3: "c"}, {1, 2, 3}, frozenset({"a"}), [], {},
    [list(range(300))],  # more items than the fast path looks at
    {"point": _Point(1)}, [lambda: 1], _Point(2),  # not builtin data: cloudpickle, as before
])
def test_a_users_value_is_pickled_as_cloudpickle_pickled_it(value):
    dumped = dump_user(value)
    if not callable(value) and not (isinstance(value, list) and value and callable(value[0])):
        assert dumped == cloudpickle.dumps(value)
    loaded = load_user(dumped)
    assert type(loaded) is type(value)


def test_a_list_holding_itself_is_left_to_cloudpickle():
    looped: list = [1]
    looped.append(looped)
    assert dump_user(looped) == cloudpickle.dumps(looped)


def _mac_part_by_part(key: bytes, unsigned: bytes, topic: str, partition: int, record_key: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(struct.pack(">I", len(topic.encode())))
    mac.update(topic.encode())
    mac.update(struct.pack(">i", partition))
    mac.update(struct.pack(">I", len(record_key)))
    mac.update(record_key)
    mac.update(unsigned)
    return mac.digest()


def test_the_mac_is_the_part_by_part_hmac_of_version_3():
    key = b"0123456789abcdef0123"
    unsigned = b"FARJ\x03" + b"x" * 300
    signed = SigningKeys(key).sign(3, unsigned, topic="agent.journal", partition=7, record_key=b"7:1:e:a:d")
    assert signed == _mac_part_by_part(key, unsigned, "agent.journal", 7, b"7:1:e:a:d")
    assert SigningKeys(b"z" * 20, verification_keys=[key]).verifies(
        unsigned + signed, topic="agent.journal", partition=7, record_key=b"7:1:e:a:d")
