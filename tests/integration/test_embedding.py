"""An agent embedded in a process-mode job (``tests/jobs/embedded_agent_job.py``), on a MiniCluster with real Kafka.

The job's own Python functions run in PyFlink's process mode; the agent's operator runs embedded (thread
mode) in the TaskManager JVM through the checkpoint bridge. Every step records, from where it runs, its
process id and whether it is PyFlink's embedded (pemja) interpreter, into a file the test reads: the
job's functions are wrapped before the job is built, so the job itself is the unchanged example.

On a MiniCluster PyFlink would run process-mode workers as threads of the client (its "loopback" mode);
``_python_worker_execution_mode=process`` makes the TaskManager start a separate Python worker process,
as on a cluster.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from flink_agents_replay.testing.agents import chain_agent, logical_call_counts
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import job_script

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "embedded_agent_job.py"
SIGNING_KEY = "test-signing-key-0123456789"
USER_STEPS = ("parse", "filter", "format")


class Trace:
    """JSON lines appended from inside Flink (pickles as its path): where each step ran."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.untraced: dict = {}  # the job's functions as they were, for the test's own use (never pickled)

    def __getstate__(self) -> dict:
        return {"path": self.path, "untraced": {}}

    def record(self, step: str) -> None:
        line = json.dumps({"step": step, "pid": os.getpid(), "argv0": (getattr(sys, "argv", None) or [""])[0],
                           "embedded": "pemja" in sys.modules, "thread": threading.current_thread().name})
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def by_step(self) -> dict[str, list[dict]]:
        steps: dict[str, list[dict]] = defaultdict(list)
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    row = json.loads(line)
                    steps[row["step"]].append(row)
        return steps


def traced(function, trace: Trace, step: str):
    def wrapper(*args):
        trace.record(step)
        return function(*args)
    return wrapper


@pytest.fixture(scope="module")
def job():
    with job_script(JOB) as module:
        yield module


@pytest.fixture
def trace(job, tmp_path, monkeypatch) -> Trace:
    """Wrap the job's functions (and the agent's CRM tool) so that each call records where it ran."""
    monkeypatch.setenv("_python_worker_execution_mode", "process")
    trace = Trace(tmp_path / "trace.jsonl")
    for name, step in (("parse_ticket", "parse"), ("is_open", "filter"), ("format_reply", "format"),
                       ("lookup_customer", "agent")):
        trace.untraced[name] = getattr(job, name)
        monkeypatch.setattr(job, name, traced(getattr(job, name), trace, step))
    return trace


@pytest.fixture(scope="module")
def tickets_topic(job, kafka_bootstrap):
    topic = f"tickets-{uuid.uuid4().hex[:8]}"
    job.write_tickets(kafka_bootstrap, topic, job.sample_tickets(40))
    return topic


def jvm_pid() -> int:
    from pyflink.java_gateway import get_gateway

    return get_gateway().jvm.ProcessHandle.current().pid()


def run(job, bootstrap: str, topic: str, agent, *, restart_attempts: int = 0,
        checkpoint_interval_ms: int = 500) -> list[str]:
    env = job.create_environment(parallelism=2, checkpoint_interval_ms=checkpoint_interval_ms,
                                 restart_attempts=restart_attempts)
    config = {"kafka": {"bootstrap.servers": bootstrap}, "journal_topic": f"journal-{uuid.uuid4().hex[:8]}",
              "signing_key": SIGNING_KEY}
    replies = job.build(job.read_tickets(env, bootstrap, topic, bounded=True), agent, config)
    with replies.execute_and_collect("embedded agent job") as results:
        return list(results)


def assert_modes(trace: Trace, *, agent_traced: bool) -> None:
    """The job's own functions ran in a separate Python worker process; the agent inside the JVM, embedded."""
    jvm, client = jvm_pid(), os.getpid()
    steps = trace.by_step()
    for step in USER_STEPS:
        assert steps[step], f"the job's {step} step recorded nothing"
        for row in steps[step]:
            assert row["pid"] not in (jvm, client), f"{step} did not run in a separate Python worker: {row}"
            assert not row["embedded"] and row["argv0"].endswith("beam_boot.py"), f"{step} not in process mode: {row}"
    if agent_traced:
        assert steps["agent"], "the agent's tool recorded nothing"
        for row in steps["agent"]:
            assert row["pid"] == jvm and row["embedded"], f"the agent did not run embedded in the JVM: {row}"


def test_agent_runs_embedded_while_the_job_runs_in_process_mode(job, kafka_bootstrap, tickets_topic, trace):
    rows = [json.loads(line) for line in run(job, kafka_bootstrap, tickets_topic, job.support_agent())]

    expected, per_customer = [], Counter()
    for ticket in job.sample_tickets(40):
        if ticket["status"] != "open":
            continue
        per_customer[ticket["customer"]] += 1
        tier = trace.untraced["lookup_customer"](ticket["customer"])["tier"]
        expected.append({"customer": ticket["customer"], "seq": per_customer[ticket["customer"]],
                         "ticket": ticket["id"], "tier": tier, "reply": job.draft_reply(ticket["text"].strip(), tier),
                         "customer_tickets": per_customer[ticket["customer"]]})
    assert len(expected) == 32 and {row["tier"] for row in expected} == {"gold", "standard"}
    assert sorted(rows, key=lambda r: r["ticket"]) == expected

    assert_modes(trace, agent_traced=True)
    steps = trace.by_step()
    assert (len(steps["parse"]), len(steps["filter"]), len(steps["format"]), len(steps["agent"])) == (40, 40, 32, 32)
    workers = {row["pid"] for step in USER_STEPS for row in steps[step]}
    print(f"\nJVM (agent, embedded) pid {jvm_pid()}; Python worker pids {sorted(workers)}; client pid {os.getpid()}")


def test_failover_in_a_process_mode_job_repeats_no_call(job, kafka_bootstrap, tickets_topic, tmp_path, trace,
                                                        operator_log):
    reference_counter = InvocationCounter(tmp_path / "reference.db")
    reference = run(job, kafka_bootstrap, tickets_topic, chain_agent(reference_counter))
    assert len(reference) == 32

    counter = InvocationCounter(tmp_path / "calls.db")
    # Slow enough calls (6 customers' runs at a time) that checkpoints complete before the failure.
    agent = chain_agent(counter, call_delay_s=0.03, fail_after_calls=32 * 6 // 2)
    outputs = run(job, kafka_bootstrap, tickets_topic, agent, restart_attempts=2, checkpoint_interval_ms=300)

    assert counter.count("fault_fired") == 1, "the failure was not injected"
    restored = [line for line in operator_log() if " restored: " in line]
    assert restored, "the job did not restore from a checkpoint"
    print("\n" + "\n".join(restored))
    assert Counter(outputs) == Counter(reference)
    calls = logical_call_counts(counter)
    assert {name: n for name, n in calls.items() if n > 1} == {}
    assert calls.keys() == logical_call_counts(reference_counter).keys()
    assert_modes(trace, agent_traced=False)


def test_a_virtualenv_job_without_python_path_fails_before_submission_naming_the_setting(job):
    from pyflink.common import Configuration, Types
    from pyflink.datastream import StreamExecutionEnvironment

    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.flink.pipeline import connect_to_agent

    assert sys.prefix != sys.base_prefix, "the suite runs in a virtualenv (./run tests creates .venv)"
    config = Configuration()
    config.set_string("python.execution-mode", "process")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    keyed = env.from_collection(["a"]).key_by(lambda ticket: ticket, key_type=Types.STRING())
    with pytest.raises(ConfigError, match=r"set python\.pythonpath in the job's configuration"):
        connect_to_agent(keyed, job.support_agent(), {"journal_enabled": False})
