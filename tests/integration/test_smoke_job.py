"""The smoke job (Kafka round trip and key groups) against the real broker, on a MiniCluster."""

import pathlib

import pytest

from flink_agents_replay.testing.jobs import job_script

pytestmark = pytest.mark.integration

JOB = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "smoke_job.py"


def test_smoke_job_writes_and_reads_back_every_record_once(kafka_bootstrap):
    with job_script(JOB) as job:
        result = job.run(kafka_bootstrap, records=300, parallelism=2)
    assert result.records_read == 300
    assert (result.missing, result.duplicates, result.key_group_mismatches) == (0, 0, 0)
    assert result.ok
    table = job.format_table(result)
    assert "verdict" in table and "OK" in table
