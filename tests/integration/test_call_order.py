"""Calls made in another order after a restore are still reused: a set iterated under another hash seed.

``tests/jobs/set_order_job.py`` runs, in a fresh process with ``PYTHONHASHSEED=1``, an agent whose action makes
one external call per element of a set of strings; each key's action is savepointed while its third call is
under way. A second fresh process, with ``PYTHONHASHSEED=2``, restores the savepoint: it iterates the same sets
in other orders, so its calls come in another order than the journaled ones. Each tool invocation is counted in
a SQLite file outside Flink. Required: every call that returned before the savepoint is reused wherever it now
comes (``done`` once per tag), the one under way at the savepoint is made again once (in doubt: its in_doubt
policy is ``rerun``), and every key's output is committed exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flink_agents_replay.flink.env import fresh_process_environment
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import produce_inputs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "set_order_job.py"
KEYS = ("k0", "k1", "k2")


def _tags(key: str) -> list[str]:
    return [f"tag{n}-{key}" for n in range(6)]


def _run_phase(phase: str, seed: str, arguments: list[str], work: Path) -> str:
    environment = {**fresh_process_environment(), "PYTHONHASHSEED": seed,
                   "FLINK_AGENTS_REPLAY_LOG_FILE": str(work / f"{phase}.log")}
    with open(work / f"{phase}.stderr", "w") as stderr:
        done = subprocess.run([sys.executable, str(JOB), "--phase", phase, *arguments], stdout=subprocess.PIPE,
                              stderr=stderr, env=environment, cwd=ROOT, text=True, timeout=300)
    assert done.returncode == 0, (work / f"{phase}.stderr").read_text(errors="replace")[-3000:]
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def test_calls_made_in_another_order_after_a_restore_in_a_new_process_are_reused(kafka_bootstrap, new_topic,
                                                                               tmp_path):
    input_topic = produce_inputs(kafka_bootstrap, [{"key": key, "tags": _tags(key)} for key in KEYS])
    output_topic = new_topic(prefix="order-out")
    counter = InvocationCounter(tmp_path / "calls.db")
    shared = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
              "--journal-topic", f"journal-{uuid.uuid4().hex[:8]}", "--counter-path", str(counter.path),
              "--keys", ",".join(KEYS), "--savepoint-dir", str(tmp_path / "savepoints")]

    savepoint = _run_phase("first", "1", shared, tmp_path)
    assert savepoint, "the first phase printed no savepoint"
    calls_before = {key: {t for t in _tags(key) if counter.count(f"call:{key}:{t}")} for key in KEYS}
    done_before = {key: {t for t in _tags(key) if counter.count(f"done:{key}:{t}")} for key in KEYS}
    assert all(len(calls_before[k]) == 3 and len(done_before[k]) == 2 for k in KEYS)  # third call under way

    _run_phase("restore", "2", [*shared, "--savepoint", savepoint], tmp_path)

    counts = counter.counts()
    orders = {phase: {k: next(n.split(":", 3)[3] for n in counts if n.startswith(f"order:{phase}:{k}:"))
                      for k in KEYS} for phase in ("first", "restore")}
    # The fault hit: the restoring process iterated the sets in other orders, and the journaled calls came in
    # at other places (the journaled ones first would need no matching at all).
    assert orders["first"] != orders["restore"]
    moved = [k for k in KEYS if orders["first"][k].split(",")[:2] != orders["restore"][k].split(",")[:2]]
    assert moved, orders
    for key in KEYS:
        assert {t: counts.get(f"done:{key}:{t}", 0) for t in _tags(key)} == dict.fromkeys(_tags(key), 1), key
        in_doubt = calls_before[key] - done_before[key]
        assert {t: counts.get(f"call:{key}:{t}", 0) for t in _tags(key)} == {
            t: 2 if t in in_doubt else 1 for t in _tags(key)}, key
    assert "made in another order" in (tmp_path / "restore.log").read_text(errors="replace")

    reader = CommittedReader(kafka_bootstrap, output_topic, decode=json.loads)
    try:
        committed = reader.read_to_committed_end(timeout_s=30)
    finally:
        reader.close()
    assert sorted((key, seq) for key, seq, _ in committed) == [(key, 1) for key in KEYS]
    assert all(sent == sorted(f"sent {t}" for t in _tags(key)) for key, _, sent in committed)
