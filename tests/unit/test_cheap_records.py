"""Cheaper records (issue #14) write the same bytes as before: the header as json.dumps wrote it, a user's plain
value as cloudpickle pickled it, and the MAC as the part-by-part HMAC computed it. The checked-in fixtures
(test_persisted_formats, test_compat_fixtures) verify that older records still restore. Private copies are what
copy.deepcopy makes."""

import copy
import hashlib
import hmac
import json
import struct
import threading
from dataclasses import dataclass

import cloudpickle
import pytest

from flink_agents_replay.api.memory import private_copy
from flink_agents_replay.core.events import Event
from flink_agents_replay.storage.formats.plain import dump_user, load_user
from flink_agents_replay.storage.records.codec import SigningKeys, encode_header


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


class _Tagged(dict):
    pass


class _Items(list):
    def __init__(self, *items):
        super().__init__(items)
        self.note = {"n": len(items)}


class _Slotted:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is _Slotted and other.x == self.x


class _Hooked:
    def __init__(self, x):
        self.x = x

    def __getstate__(self):
        return {"x": self.x, "hooked": True}

    def __eq__(self, other):
        return type(other) is _Hooked and other.__dict__ == self.__dict__


@dataclass(frozen=True)
class _Frozen(Event):
    items: list


@pytest.mark.parametrize("value", [
    {"a": [1, 2, {"b": 1.5, "c": (1, [2])}], 3: "c", None: b"x"}, [[], {}, ()], ("t", ("u", 1)), "s", 7,
    {"s": {1, 2}, "f": frozenset({3})}, _Tagged(x=[1]), {"point": _Point(1)}, [_Point(2)],
    _Items([1], 2), [_Slotted([3])], _Hooked([4]), _Frozen([5]), Event(a=[1], b={"c": (2, [3])}),
])
def test_a_private_copy_equals_a_deepcopy_and_shares_no_mutable_part(value):
    copied = private_copy(value)
    assert copied == copy.deepcopy(value) and type(copied) is type(value)
    originals, copies = _mutable_parts(value), _mutable_parts(copied)
    assert len(originals) == len(copies) and not {id(part) for part in originals} & {id(part) for part in copies}


def test_a_private_copy_keeps_a_values_shared_and_looped_parts_as_deepcopy_does():
    shared = [1]
    copied = private_copy({"x": shared, "y": shared, "z": (shared,)})
    assert copied["x"] is copied["y"] is copied["z"][0] and copied["x"] is not shared
    looped: list = [1]
    looped.append(looped)
    copied_loop = private_copy(looped)
    assert copied_loop[1] is copied_loop and copied_loop is not looped


def test_a_value_deepcopy_refuses_is_kept_as_it_is():
    value = {"lock": threading.Lock()}
    assert private_copy(value) is value
    nested: list = []
    for _ in range(5000):  # deeper than the recursion limit
        nested = [nested]
    assert private_copy(nested) is nested


def _mutable_parts(value) -> list:
    parts, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, dict, set, _Point, _Slotted, Event)):
            parts.append(item)
        if isinstance(item, (_Point, _Hooked, Event, _Items)):
            stack.append(vars(item))
        if isinstance(item, _Slotted):
            stack.append(item.x)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return parts
