"""The savepoint workflow with Flink's own client, on a local standalone cluster, with the packaged main job.

    flink run -d -pym flink_agents_replay.jobs.agent_job ...                 # submit
    flink stop --savepointPath DIR <job id>                                  # stop with a savepoint
    flink run -d -s <savepoint> -pym flink_agents_replay.jobs.agent_job ...  # restore, at the same and another p

Three batches of tickets, one per run of the job (p=2, then p=2 from the first savepoint, then p=3 from the
second). Every reply must be committed exactly once and equal a failure-free run computed by construction
(so the customers' memory carried over), and the model and order service — counting every request in this
process — must have executed every logical call once. A restore with a changed agent id (so a changed
operator uid) must fail with Flink's own error.

The job captures its traffic (``--capture``); at the end the packaged replay job replays the unchanged agent
from the second savepoint with every call ``recorded``
(``flink run -s <savepoint> -pym flink_agents_replay.jobs.replay_job``)
and ``flink-agents-replay diff --fail-on-diff`` must find no difference, with no request reaching the
service; the same replay under another agent id is refused before submission.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from flink_agents_replay.examples.support_triage import make_tickets, produce_tickets, support_triage_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from flink_agents_replay.testing.jobs import failure_free_outputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AGENT_JOB, REPLAY_JOB = "flink_agents_replay.jobs.agent_job", "flink_agents_replay.jobs.replay_job"


def _packaged(module: str) -> list[str]:
    """The packaged job ``module``, with Flink's Kafka connector as `flink run --jarfile`, as a user submits it."""
    return ["--jarfile", str(kafka_connector_jar()), "-pym", module]
SIGNING_KEY = "savepoint-workflow-signing-key"
_SAVEPOINT = re.compile(r"Savepoint completed\. Path: (\S+)")


def reference_replies(tickets: list[dict], base_url: str) -> dict[str, dict]:
    """Every ticket's reply from a failure-free run in ticket order (each customer's tickets in order)."""
    agent = support_triage_agent(name="reference", model_base_url=base_url)
    outputs = failure_free_outputs(agent, tickets, key_of=lambda ticket: ticket["customer"])
    return {output.output["ticket_id"]: {"seq": output.seq, **output.output} for output in outputs}


def produce(bootstrap: str, topic: str, tickets: list[dict]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    produce_tickets(producer, topic, tickets)
    assert producer.flush(30) == 0


def test_submit_stop_with_savepoint_restore_same_and_other_parallelism_and_changed_uid(
        kafka_bootstrap, new_topic, flink_cluster, model_server, tmp_path, operator_log):
    # Few customers with many tickets each: a customer's tickets run one after another, so a batch takes
    # seconds (6-7 tickets x 3 calls x 0.4 s) and a savepoint taken while it runs holds runs in flight.
    customers = 6
    batches = [make_tickets(40, customers=customers, start=start) for start in (0, 40, 80)]
    tickets = [ticket for batch in batches for ticket in batch]
    expected = reference_replies(tickets, model_server().base_url)
    server = model_server(delay_ms=400)
    input_topic, output_topic = new_topic(2, "tickets"), new_topic(2, "replies")
    agent_id = f"triage-{input_topic[-6:]}"
    savepoints = tmp_path / "savepoints"
    cluster = flink_cluster(taskmanagers=1)
    cluster.start()

    def job_args(parallelism: int, agent: str = agent_id) -> list[str]:
        return ["--bootstrap-servers", kafka_bootstrap, "--input-topic", input_topic, "--output-topic", output_topic,
                "--agent-id", agent, "--parallelism", str(parallelism), "--model-base-url", server.base_url,
                "--signing-key", SIGNING_KEY, "--checkpoint-interval-ms", "1000", "--restart-attempts", "0",
                "--capture"]

    reader = CommittedReader(kafka_bootstrap, output_topic, decode=json.loads)

    def committed() -> set[str]:
        return {row["ticket_id"] for row in reader.poll(0.2)}

    def stop_with_savepoint(job_id: str) -> str:
        result = cluster.flink_command("stop", "--savepointPath", str(savepoints), job_id, check=True)
        match = _SAVEPOINT.search(result.stdout)
        assert match, result.stdout
        poll_until(lambda: cluster.job_status(job_id) == "FINISHED", 60, lambda: cluster.job_diagnostics(job_id))
        return match.group(1)

    def run_batch(batch: list[dict], parallelism: int, savepoint: str | None, last: bool) -> tuple[str, tuple]:
        """Feed ``batch``, submit (restoring ``savepoint`` if given); stop with a savepoint mid-batch unless last."""
        produce(kafka_bootstrap, input_topic, batch)
        chat_before = server.stats().chat
        restore = ["-s", savepoint] if savepoint else []
        log_from = len(operator_log())
        result = cluster.flink_command("run", "-d", *restore, *_packaged(AGENT_JOB), *job_args(parallelism), check=True)
        job_id = re.search(r"JobID\s+([0-9a-f]{32})", result.stdout + result.stderr).group(1)
        if not last:
            # Stop once every customer's first ticket of the batch is being answered: runs are in flight.
            poll_until(lambda: server.stats().chat >= chat_before + customers, 120,
                       lambda: cluster.job_diagnostics(job_id))
            savepoint = stop_with_savepoint(job_id)
        else:
            poll_until(lambda: committed() >= {t["ticket_id"] for t in tickets}, 180,
                       lambda: f"{len(committed())} replies; {cluster.job_diagnostics(job_id)}")
        restores = sorted(set(line.split(" INFO ", 1)[-1] for line in operator_log()[log_from:]
                              if " restored: " in line))
        if restore:
            # Every subtask of the new parallelism read its own journal partitions from the savepoint.
            assert [int(line.split()[2]) for line in restores] == list(range(parallelism)), restores
        in_flight = sum(int(line.rsplit("; ", 1)[1].split()[0]) for line in restores)
        return (savepoint if not last else job_id), (parallelism, len(restores), in_flight)

    runs = []
    savepoint = None
    for number, (batch, parallelism) in enumerate(zip(batches, (2, 2, 3), strict=True)):
        last = number == len(batches) - 1
        outcome, run = run_batch(batch, parallelism, savepoint, last)
        runs.append(run)
        if last:
            job_id = outcome
        else:
            savepoint = outcome

    last = cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"]
    poll_until(lambda: cluster.rest_get(f"/jobs/{job_id}/checkpoints")["counts"]["completed"] > last, 60,
               lambda: cluster.job_diagnostics(job_id))
    rows = reader.read_to_committed_end()
    reader.close()
    final_savepoint = stop_with_savepoint(job_id)

    assert sum(in_flight for _, _, in_flight in runs) > 0, f"no run was in flight at a savepoint: {runs}"
    # Three stops with a savepoint are ordinary stops: the TaskManagers logged no warning about the wake-ups.
    warnings = [line for log in cluster.log_dir.glob("*taskexecutor*.log") for line in log.read_text().splitlines()
                if " WARN " in line and "wake-ups" in line]
    assert warnings == [], warnings[:4]
    replies = Counter(row["ticket_id"] for row in rows)
    assert [t for t, n in replies.items() if n > 1] == [], "replies committed twice"
    assert {row["ticket_id"]: row for row in rows} == expected
    stats = server.stats()
    assert stats.repeated == 0, f"{stats.repeated} requests executed twice"
    assert stats.chat == 2 * len(tickets) + sum(1 for t in tickets if t["order_id"])  # + a tool-call turn each
    assert stats.orders == sum(1 for t in tickets if t["order_id"])

    # Another agent id is another operator uid: Flink cannot map the savepoint's agent state and says so.
    changed = cluster.flink_command("run", "-s", final_savepoint, *_packaged(AGENT_JOB), *job_args(2, agent="renamed"),
                                    timeout_s=300)
    output = changed.stdout + changed.stderr
    assert changed.returncode != 0
    assert "Cannot map checkpoint/savepoint state for operator" in output, output[-3000:]
    assert "--allowNonRestoredState" in output or "allowNonRestoredState" in output
    # Replay the unchanged agent from the second savepoint (p=3 batch's start) on recorded calls: no difference.
    def replay(name: str, agent: str = agent_id):
        return cluster.flink_command(
            "run", "-s", savepoint, *_packaged(REPLAY_JOB), "--replay-name", name, "--agent-id", agent,
            "--bootstrap-servers", kafka_bootstrap, "--output-topic", output_topic, "--side-effects", "*=recorded",
            "--model-base-url", server.base_url, "--signing-key", SIGNING_KEY, timeout_s=300)

    before = server.stats()
    replayed = replay("unchanged")
    assert replayed.returncode == 0, (replayed.stdout + replayed.stderr)[-3000:]
    diff = subprocess.run([sys.executable, "-m", "flink_agents_replay.cli", "diff", "--bootstrap-servers",
                           kafka_bootstrap, "--agent-id", agent_id, "--signing-key", SIGNING_KEY, "--fail-on-diff",
                           "--replay", f"flink-agents-replay.{agent_id}.capture.replay-unchanged"],
                          capture_output=True, text=True, timeout=120)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    compared = int(re.search(r"compared\s+(\d+)", diff.stdout).group(1))
    assert compared >= len(batches[2]), diff.stdout
    assert re.search(r"same\s+(\d+)", diff.stdout).group(1) == str(compared), diff.stdout
    after = server.stats()
    assert (after.chat, after.orders) == (before.chat, before.orders), "the recorded replay reached the service"
    refused = replay("renamed", agent="renamed")
    assert refused.returncode != 0
    assert "holds no state of operator 'flink-agents-replay/renamed'" in refused.stdout + refused.stderr

    print(f"\nsavepoint workflow: runs (parallelism, subtasks restored, runs in flight at the savepoint): {runs}; "
          f"{len(tickets)} replies once each; model {stats.chat}, orders {stats.orders}, repeated {stats.repeated}, "
          f"answered by idempotency key {stats.idempotent_replays}; replay from the second savepoint: {compared} "
          f"inputs, no difference, no request")
