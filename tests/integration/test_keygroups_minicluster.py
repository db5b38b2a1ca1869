"""Key-group parity inside Flink: every key reaches the subtask whose range holds our computed group."""

import pytest
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction

from flink_agents_replay.core.keygroups import key_group, key_group_range
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.runtime_info import subtask_info
from tests.harness.sample_keys import sample_int_keys, sample_long_keys, sample_string_keys

pytestmark = pytest.mark.integration

PARALLELISM = 4
# A wrong group for a kind of key lands outside the receiving subtask's range 3 times in 4: hundreds of keys of each
# type find it (tests/unit/test_keygroups.py compares 1,200 sample keys with the groups Java's own classes computed).
KEY_COUNTS = {"STRING": 600, "LONG": 300, "INT": 300}


class CheckKeyGroup(KeyedProcessFunction):
    """Emits (key type, subtask, repr(key), computed group, whether this subtask owns it)."""

    def __init__(self, key_type: str):
        self.key_type = key_type

    def open(self, runtime_context):
        info = subtask_info(runtime_context)
        self.info = info
        self.owned = key_group_range(info.index, info.parallelism, info.max_parallelism)

    def process_element(self, value, ctx):
        group = key_group(ctx.get_current_key(), self.key_type, self.info.max_parallelism)
        yield self.key_type, self.info.index, repr(value), group, group in self.owned


@pytest.mark.parametrize("max_parallelism", [128, 300])
def test_computed_key_group_is_owned_by_receiving_subtask(max_parallelism):
    env = create_environment(parallelism=PARALLELISM, max_parallelism=max_parallelism)
    samples = {
        "STRING": (sample_string_keys(KEY_COUNTS["STRING"]), Types.STRING()),
        "LONG": (sample_long_keys(KEY_COUNTS["LONG"]), Types.LONG()),
        "INT": (sample_int_keys(KEY_COUNTS["INT"]), Types.INT()),
    }
    row_type = Types.TUPLE([Types.STRING(), Types.INT(), Types.STRING(), Types.INT(), Types.BOOLEAN()])
    checked = []
    for name, (keys, type_info) in samples.items():
        stream = env.from_collection(keys, type_info=type_info)
        checked.append(
            stream.key_by(lambda k: k, key_type=type_info).process(CheckKeyGroup(name), output_type=row_type)
        )
    union = checked[0].union(*checked[1:])
    with union.execute_and_collect(f"key-group parity maxP={max_parallelism}") as results:
        rows = list(results)

    assert len(rows) == sum(KEY_COUNTS.values())
    mismatches = [row for row in rows if not row[4]]
    assert mismatches == [], f"{len(mismatches)} keys reached a subtask that does not own their key group"
    for name in KEY_COUNTS:
        subtasks = {row[1] for row in rows if row[0] == name}
        assert subtasks == set(range(PARALLELISM)), f"{name} keys did not spread over all subtasks"
    # The hard cases really went through Flink.
    strings = {row[2] for row in rows if row[0] == "STRING"}
    assert repr("🦀") in strings and repr("ключ") in strings
    longs = {row[2] for row in rows if row[0] == "LONG"}
    assert repr(2**63 - 1) in longs and repr(-(2**63)) in longs
