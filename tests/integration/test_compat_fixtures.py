"""Every version's compatibility fixtures restore, and their journal is reused (Flink's migration tests' way).

For each ``tests/fixtures/compat/v*/`` (made by ``tests/fixtures/compat/make_fixtures.py`` of that version): load
its topic dumps into the broker (new topics: new topic ids, the same offsets), restore its savepoint into
``tests/jobs/compat_job.py`` run by a fresh Python process with another hash seed, feed the inputs after the
savepoint, and check that the committed outputs are the expected ones and that only calls the fixture's journal
does not hold were made. Without ``accept_moved_journal_from`` the restore must fail, saying how to accept the
moved journal.

For each ``tests/fixtures/compat/v*/waits/`` (``make_waits_fixtures.py``: runs parked at ``ctx.wait_for`` in the
savepoint, ``tests/jobs/compat_waits_job.py``), the same restore, then the decisions: every parked run resumes once,
reusing its calls before the wait (and what the journal holds of it after the savepoint), the inputs held behind
parked runs run, and the early decision kept in state applies.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from flink_agents_replay.flink.env import fresh_process_environment
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.storage.journal.transfer import load_topic
from flink_agents_replay.storage.records.codec import SigningKeys
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script, produce_inputs, produce_json, running_job, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "compat_job.py"
WAITS_JOB = ROOT / "tests" / "jobs" / "compat_waits_job.py"
FIXTURES = sorted(p.parent for p in (ROOT / "tests" / "fixtures" / "compat").glob("v*/fixture.json"))
WAITS_FIXTURES = sorted(p.parent for p in (ROOT / "tests" / "fixtures" / "compat").glob("v*/waits/fixture.json"))
_RESTORED = re.compile(r"subtask (\d+) restored: read (\d+) journal records")


def test_there_are_fixtures():
    assert FIXTURES, "no compatibility fixtures under tests/fixtures/compat/"
    assert WAITS_FIXTURES, "no compatibility fixtures with parked runs under tests/fixtures/compat/v*/waits/"


def _load_fixture_topics(bootstrap: str, fixture: Path, description: dict) -> tuple[dict[str, str], str]:
    """Load the dumps into new topics; return their names by role, and the journal's old topic id."""
    suffix = uuid.uuid4().hex[:6]
    journal, capture = f"compat-journal-{suffix}", f"compat-capture-{suffix}"
    names = {"journal": journal, "capture": capture, "manifest": f"{capture}.manifest"}
    return names, _load_dumps(bootstrap, fixture, description, names)["journal"]


def _load_dumps(bootstrap: str, fixture: Path, description: dict, names: dict[str, str]) -> dict[str, str]:
    """Load each dump into the new topic of its role; return the old topic ids by role."""
    old_ids = {}
    for role, dump in description["dumps"].items():
        # The records keep the fixture's timestamps: no retention may delete them as too old.
        # Under new names: records of envelope v3 on (signed for their topic) are re-signed with the fixture's key.
        loaded = load_topic({"bootstrap.servers": bootstrap}, path=fixture / dump, topic=names[role],
                            config_overrides={"retention.ms": "-1"},
                            signing_keys=SigningKeys(description["signing_key"].encode()))
        old_ids[role] = loaded.old_topic_id
    return old_ids


def _job_arguments(bootstrap: str, work: Path, names: dict[str, str], savepoint: Path, accept: str | None,
                   input_topic: str, output_topic: str, counter: InvocationCounter) -> list[str]:
    arguments = ["--bootstrap-servers", bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
                 "--journal-topic", names["journal"], "--capture-topic", names["capture"],
                 "--counter-path", str(counter.path), "--savepoint", str(savepoint),
                 "--source-uid", f"compat-inputs-{work.name}", "--checkpoint-interval-ms", "500"]
    return arguments + (["--accept-moved-journal-from", accept] if accept else [])


def _restore(bootstrap: str, work: Path, names: dict[str, str], savepoint: Path, accept: str,
             input_topic: str, output_topic: str) -> tuple[subprocess.Popen, InvocationCounter, Path]:
    counter = InvocationCounter(work / "calls.db")
    arguments = _job_arguments(bootstrap, work, names, savepoint, accept, input_topic, output_topic, counter)
    process, log = _start_job(JOB, arguments, work)
    return process, counter, log


def _start_job(script: Path, arguments: list[str], work: Path) -> tuple[subprocess.Popen, Path]:
    """Run a job script in a fresh Python process; its operator log is ``work/operator.log``."""
    log = work / "operator.log"
    # A fresh process, as a resubmitted job is: a Flink job run earlier in this test session left variables here
    # that a new PyFlink driver must not inherit.
    environment = {**fresh_process_environment(), "PYTHONHASHSEED": "7", "FLINK_AGENTS_REPLAY_LOG_FILE": str(log)}
    # Output to files, not pipes: a full pipe would block the job's process. Its stdin stays open while it runs.
    with open(work / "stdout", "w") as stdout, open(work / "stderr", "w") as stderr:
        process = subprocess.Popen([sys.executable, str(script), *arguments], stdin=subprocess.PIPE, stdout=stdout,
                                   stderr=stderr, env=environment, cwd=ROOT)
    return process, log


def _refused_restore(bootstrap: str, work: Path, names: dict[str, str], savepoint: Path, input_topic: str,
                     output_topic: str) -> tuple[str, InvocationCounter]:
    """The restore without ``accept_moved_journal_from``, in this process (it fails before its first run, so no new
    process is needed to tell it apart): the job's failure as text, and its counter."""
    counter = InvocationCounter(work / "calls.db")
    with job_script(JOB) as job:
        env = job.build(job.parse_args(_job_arguments(bootstrap, work, names, savepoint, None, input_topic,
                                                      output_topic, counter)))
        # Bounded: a restore that is not refused runs on (an unbounded input); then the failure says it timed out.
        with running_job(env, "compat fixture job, refused") as client:
            with pytest.raises(Exception) as failure:  # noqa: B017 - the job's failure arrives as a Py4J error
                wait_until(client, lambda: False, "the restore's refusal", timeout_s=120)
    return str(failure.value), counter


def _stderr(work: Path) -> str:
    return (work / "stderr").read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_fixture_restores_and_reuses_its_journal(fixture, kafka_bootstrap, tmp_path):
    description = json.loads((fixture / "fixture.json").read_text())
    expected = json.loads((fixture / "expected.json").read_text())
    inputs = json.loads((fixture / "inputs.json").read_text())
    names, old_journal_id = _load_fixture_topics(kafka_bootstrap, fixture, description)
    savepoint = tmp_path / "savepoint"
    shutil.copytree(fixture / "savepoint", savepoint)
    input_topic = produce_inputs(kafka_bootstrap, inputs["after_savepoint"])

    # Without the setting: the new topic id is refused, and the error says how to accept a moved journal (in this
    # process, while the restore with it starts in a fresh one: there, the journal is reused).
    (tmp_path / "refused").mkdir()
    (tmp_path / "accepted").mkdir()
    output_topic = f"compat-out-{uuid.uuid4().hex[:6]}"
    ensure_topics(kafka_bootstrap, [output_topic], partitions=1)
    process, counter, log = _restore(kafka_bootstrap, tmp_path / "accepted", names, savepoint, old_journal_id,
                                     input_topic, output_topic)
    try:
        refusal, refused_calls = _refused_restore(kafka_bootstrap, tmp_path / "refused", names, savepoint, input_topic,
                                                  f"compat-out-refused-{uuid.uuid4().hex[:6]}")
    except BaseException:
        process.stdin.close()
        process.wait(timeout=120)
        raise
    wanted = Counter(tuple(row) for row in expected["outputs"])
    try:
        with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: value.decode()) as reader:
            poll_until(lambda: process.poll() is not None or len(reader.poll()) >= len(wanted), 300,
                       lambda: f"{len(reader.rows)} of {len(wanted)} outputs committed")
            assert process.poll() is None, _stderr(tmp_path / "accepted")
            rows = reader.read_to_committed_end()
    finally:
        process.stdin.close()  # the job script cancels its job and exits
        process.wait(timeout=120)
    assert f"accept_moved_journal_from={old_journal_id!r}" in refusal and "journal dump" in refusal, refusal[-3000:]
    assert not [n for n in refused_calls.counts() if n.startswith("call:")]

    assert process.returncode == 0, _stderr(tmp_path / "accepted")
    assert Counter(tuple(json.loads(row)) for row in rows) == wanted
    calls = {name: n for name, n in counter.counts().items() if name.startswith("call:")}
    assert not set(calls) & set(expected["calls_journaled"]), "a journaled call was made again"
    assert calls == dict.fromkeys(expected["calls_executed"], 1)
    lines = log.read_text().splitlines()
    assert any("accepted the moved journal" in line and old_journal_id in line for line in lines), lines[-20:]
    read = [int(match.group(2)) for line in lines if (match := _RESTORED.search(line))]
    assert read and sum(read) > 0, f"no journal records read at the restore: {lines[-20:]}"
    print(f"\n{fixture.name}: restored; journal records read per subtask {read}; {len(rows)} outputs; "
          f"{len(calls)} calls made, {len(expected['calls_journaled'])} journaled calls reused")


@pytest.mark.parametrize("fixture", WAITS_FIXTURES, ids=[p.parent.name for p in WAITS_FIXTURES])
def test_parked_runs_restore_resume_once_with_their_calls_reused_and_held_inputs_run(fixture, kafka_bootstrap,
                                                                                     tmp_path):
    """The savepoint holds runs parked at ``ctx.wait_for`` (``make_waits_fixtures.py`` says which): in the default
    mode with later inputs held behind them and an early decision for a wait not reached yet, and kept aside
    (``later_inputs_while_waiting="run"``), two per key, with the later inputs between them run. The journal holds,
    after the savepoint, two runs the old job resumed and finished (one with a ``resumed`` record).

    Restored with the current code, fed stage by stage (``inputs.json``): stage 1's inputs, then decisions (those of
    after the savepoint again, new ones, and duplicates of ones applied before it), then more decisions, then a
    probe per key. Each stage's outputs are committed exactly as expected (read_committed) before the next is sent;
    the input the journal recorded after a resume waits for it. Each parked run resumes once, only calls no run
    made before are made (a parked run's lookup is reused from its state, a payment journaled after the savepoint
    from the journal), and the wait events are as expected."""
    description = json.loads((fixture / "fixture.json").read_text())
    expected = json.loads((fixture / "expected.json").read_text())
    stages = json.loads((fixture / "inputs.json").read_text())["restore_stages"]
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"compat-waits-{role}-journal-{suffix}" for role in description["dumps"]}
    old_ids = _load_dumps(kafka_bootstrap, fixture, description, names)
    savepoint = tmp_path / "savepoint"
    shutil.copytree(fixture / "savepoint", savepoint)
    input_topic = produce_inputs(kafka_bootstrap, stages[0]["inputs"])
    signals_topic = produce_inputs(kafka_bootstrap, stages[0]["decisions"])
    output_topic = f"compat-waits-out-{suffix}"
    ensure_topics(kafka_bootstrap, [output_topic], partitions=1)
    counter = InvocationCounter(tmp_path / "calls.db")
    arguments = ["--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--signals-topic",
                 signals_topic, "--output-topic", output_topic, "--counter-path", str(counter.path),
                 "--savepoint", str(savepoint), "--source-uid", f"compat-waits-{suffix}",
                 "--checkpoint-interval-ms", "300"]
    for role, name in names.items():
        arguments += [f"--{role}-journal-topic", name, f"--accept-moved-{role}-journal-from", old_ids[role]]
    process, log = _start_job(WAITS_JOB, arguments, tmp_path)
    wanted: Counter = Counter()
    try:
        with CommittedReader(kafka_bootstrap, output_topic, decode=lambda value: value.decode()) as reader:
            for number, (stage, outputs) in enumerate(zip(stages, expected["stages"], strict=True), 1):
                if number > 1:
                    produce_json(kafka_bootstrap, input_topic, stage["inputs"])
                    produce_json(kafka_bootstrap, signals_topic, stage["decisions"])
                wanted.update(tuple(row) for row in outputs["outputs"])

                def missing(wanted=wanted) -> Counter:
                    return wanted - Counter(tuple(json.loads(row)) for row in reader.poll(0.1))

                def waiting_for(number=number) -> str:
                    return f"stage {number}: outputs not committed {sorted(missing())}; {_stderr(tmp_path)[-1500:]}"

                # The first stage restores the job too.
                poll_until(lambda: process.poll() is not None or not missing(), 120 if number == 1 else 60,
                           waiting_for, interval_s=0)
                assert process.poll() is None, _stderr(tmp_path)
                if number == 1:  # the input recorded after a resume waits for that resume (stage 2's decision)
                    early = {(key, seq) for key, seq, _ in map(json.loads, reader.rows)}
                    assert not early & {tuple(run) for run in expected["not_before_stage_2"]}, reader.rows
            rows = reader.read_to_committed_end()
    finally:
        process.stdin.close()  # the job script cancels its job and exits
        process.wait(timeout=120)
    assert process.returncode == 0, _stderr(tmp_path)
    assert Counter(tuple(json.loads(row)) for row in rows) == wanted  # each once, nothing else

    counts = counter.counts()
    calls = {name: n for name, n in counts.items() if name.startswith("call:")}
    again = sorted(set(calls) & set(expected["calls_made_before"]))
    assert not again, f"calls the old job made were made again: {again}"
    assert calls == dict.fromkeys(expected["calls_executed"], 1)
    # (kind, key, wait id): every wait event of the restored job, counted outside the worker.
    events = Counter({tuple(name.split(":", 3)[1:]): n for name, n in counts.items() if name.startswith("event:")})
    assert events == Counter(tuple(event) for event in expected["events"])  # each parked run resumed once
    lines = log.read_text().splitlines()
    for role, old_id in old_ids.items():
        assert any("accepted the moved journal" in line and old_id in line for line in lines), (role, lines[-20:])
    read = [int(match.group(2)) for line in lines if (match := _RESTORED.search(line))]
    assert len(read) == 2 * len(names) and sum(read) > 0, f"journal records read at the restore: {lines[-20:]}"
    print(f"\n{fixture.parent.name}/waits: restored; journal records read per subtask {read}; {len(rows)} outputs; "
          f"{len(calls)} calls made, {len(expected['calls_made_before'])} made before not made again; "
          f"{sum(events.values())} wait events")
