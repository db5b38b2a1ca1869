"""Key groups computed in Python against values Flink's Java classes computed (tests/fixtures)."""

import json
import pathlib

import pytest
from pyflink.common import Types

from flink_agents_replay.core.keygroups import (
    UnsupportedKeyTypeError,
    java_hash_code,
    key_group,
    key_group_range,
    key_type_name,
    murmur_hash,
    operator_index_for_key_group,
)

FIXTURE = pathlib.Path(__file__).parent.parent / "fixtures" / "keygroups_java.json"
JAVA_ROWS = json.loads(FIXTURE.read_text(encoding="utf-8"))


def test_fixture_covers_the_hard_cases():
    strings = [r["key"] for r in JAVA_ROWS if r["key_type"] == "STRING"]
    longs = [r["key"] for r in JAVA_ROWS if r["key_type"] == "LONG"]
    assert any(any(ord(c) > 0xFFFF for c in s) for s in strings), "no astral-plane key"
    assert any(any(0x7F < ord(c) <= 0xFFFF for c in s) for s in strings), "no non-ASCII BMP key"
    assert {2**63 - 1, -(2**63)} <= set(longs)
    assert len(JAVA_ROWS) >= 1000


def test_java_hash_codes_match():
    mismatches = [r for r in JAVA_ROWS if java_hash_code(r["key"], r["key_type"]) != r["java_hash_code"]]
    assert mismatches == []


@pytest.mark.parametrize("max_parallelism", [128, 300, 512])
def test_key_groups_match_java(max_parallelism):
    mismatches = [
        (r["key_type"], r["key"])
        for r in JAVA_ROWS
        if key_group(r["key"], r["key_type"], max_parallelism) != r["key_groups"][str(max_parallelism)]
    ]
    assert mismatches == []


def test_row_wrapper_matters():
    # Without the +62 of Row.hashCode most keys land elsewhere: guard against "simplifying" it away.
    wrong = sum(
        murmur_hash(r["java_hash_code"]) % 128 != r["key_groups"]["128"] for r in JAVA_ROWS
    )
    assert wrong > len(JAVA_ROWS) // 2


def test_murmur_of_min_value_is_zero_or_positive():
    assert all(murmur_hash(v) >= 0 for v in (0, 1, -1, 2**31 - 1, -(2**31)))


@pytest.mark.parametrize("parallelism,max_parallelism", [(1, 128), (3, 128), (4, 300), (7, 512), (128, 128)])
def test_ranges_partition_the_key_groups(parallelism, max_parallelism):
    ranges = [key_group_range(i, parallelism, max_parallelism) for i in range(parallelism)]
    covered = [g for r in ranges for g in r]
    assert covered == list(range(max_parallelism))
    for i, r in enumerate(ranges):
        assert all(operator_index_for_key_group(g, parallelism, max_parallelism) == i for g in r)


def test_key_type_names():
    assert key_type_name(Types.STRING()) == "STRING"
    assert key_type_name(Types.LONG()) == "LONG"
    assert key_type_name(Types.INT()) == "INT"
    assert key_type_name("long") == "LONG"


@pytest.mark.parametrize("bad_type", [Types.DOUBLE(), Types.PICKLED_BYTE_ARRAY(), None, "ROW"])
def test_unsupported_key_types_are_refused(bad_type):
    with pytest.raises(UnsupportedKeyTypeError, match="key_type=Types.STRING"):
        key_group("k", bad_type, 128)


@pytest.mark.parametrize(
    "key,key_type",
    [(1, "STRING"), ("1", "LONG"), (True, "INT"), (2**31, "INT"), (2**63, "LONG"), (1.5, "LONG")],
)
def test_keys_that_do_not_fit_their_type_are_refused(key, key_type):
    with pytest.raises(UnsupportedKeyTypeError):
        key_group(key, key_type, 128)


@pytest.mark.parametrize("args", [(0, 0, 128), (4, 4, 128), (0, 200, 128), (0, 1, 0), (0, 1, 40000)])
def test_bad_ranges_are_refused(args):
    with pytest.raises(ValueError):
        key_group_range(*args)
