"""The README's main job (for now the smoke job) against the real broker, on a MiniCluster."""

import importlib.util
import pathlib
import sys

import cloudpickle
import pytest

pytestmark = pytest.mark.integration

JOB = pathlib.Path(__file__).resolve().parents[2] / "jobs" / "smoke_job.py"


def _load_job():
    spec = importlib.util.spec_from_file_location("smoke_job", JOB)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    # Under `flink run -py` the job is __main__ and ships by value; imported here, it must be told to.
    cloudpickle.register_pickle_by_value(module)
    return module


def test_smoke_job_writes_and_reads_back_every_record_once(kafka_bootstrap):
    job = _load_job()
    result = job.run(kafka_bootstrap, records=300, parallelism=2)
    assert result.records_read == 300
    assert (result.missing, result.duplicates, result.key_group_mismatches) == (0, 0, 0)
    assert result.ok
    table = job.format_table(result)
    assert "verdict" in table and "OK" in table
