"""Every code block of the README and docs/ marked ``<!-- block: run -->`` runs green, as a user would run it:
a fresh process in an empty directory, against the suite's Kafka broker and the stub model service, which the
blocks reach through the standard settings (``$KAFKA_BOOTSTRAP_SERVERS``, ``$OPENAI_BASE_URL``,
``$OPENAI_API_KEY``, ``$FLINK_AGENTS_REPLAY_SIGNING_KEY``). Blocks marked otherwise are listed with their
reasons by tests/unit/test_docs.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flink_agents_replay.local.jars import kafka_connector_jar
from tests.harness.doc_blocks import all_blocks

RUN = [block for block in all_blocks() if block.runs_here]


@pytest.fixture(scope="module")
def model_server_module():
    from flink_agents_replay.local.model_server import StubModelServer

    server = StubModelServer(port=0).start()
    yield server
    server.stop()


@pytest.mark.parametrize("block", RUN, ids=[block.where for block in RUN])
def test_a_block_marked_run_runs_green(block, kafka_bootstrap, model_server_module, tmp_path: Path):
    environment = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                   "OPENAI_BASE_URL": model_server_module.base_url, "OPENAI_API_KEY": "stub-key",
                   "FLINK_AGENTS_REPLAY_SIGNING_KEY": "a-signing-key-for-the-docs",
                   "FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR": str(kafka_connector_jar()),
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = tmp_path / ("block.py" if block.language == "python" else "block.sh")
    script.write_text(block.code)
    command = [sys.executable, script.name] if block.language == "python" else ["bash", "-euo", "pipefail",
                                                                                script.name]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.where} failed:\n{(done.stdout + done.stderr)[-5000:]}"
    print(f"{block.where}:\n{done.stdout[-2000:]}")
