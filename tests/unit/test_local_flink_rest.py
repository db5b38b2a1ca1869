"""LocalFlinkCluster's job control over the REST API (cancel, savepoint, stop with a savepoint), against a stub of
the JobManager's REST endpoints: what it sends, what it waits for, and the errors it gives."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.flink_cluster import LocalFlinkCluster

JOB = "a" * 32


class _JobManager:
    """The REST endpoints the helpers use; ``savepoint_failure`` makes every savepoint fail with it."""

    def __init__(self, savepoint_failure: str | None = None):
        self.requests: list[tuple[str, str, dict | None]] = []
        self.status, self.polls, self.savepoint_failure = "RUNNING", 0, savepoint_failure
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(*stub.get(self.path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._answer(*stub.send("POST", self.path, body))

            def do_PATCH(self):
                self._answer(*stub.send("PATCH", self.path, None))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def send(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        self.requests.append((method, path, body))
        if path == f"/jobs/{JOB}?mode=cancel":
            self.status = "CANCELED"
            return 202, {}
        if path in (f"/jobs/{JOB}/savepoints", f"/jobs/{JOB}/stop"):
            return 202, {"request-id": "t1"}
        return 404, {"errors": ["not found"]}

    def get(self, path: str) -> tuple[int, dict]:
        if path == f"/jobs/{JOB}/status":
            return 200, {"status": self.status}
        if path == f"/jobs/{JOB}/savepoints/t1":
            self.polls += 1
            if self.polls < 3:
                return 200, {"status": {"id": "IN_PROGRESS"}}
            if self.savepoint_failure:
                return 200, {"status": {"id": "COMPLETED"},
                             "operation": {"failure-cause": {"stack-trace": self.savepoint_failure}}}
            if self.requests[-1][1].endswith("/stop"):
                self.status = "FINISHED"
            return 200, {"status": {"id": "COMPLETED"}, "operation": {"location": "file:/sp/savepoint-1"}}
        return 404, {"errors": ["not found"]}

    def cluster(self, tmp_path) -> LocalFlinkCluster:
        return LocalFlinkCluster(tmp_path, rest_port=self.server.server_address[1])


@pytest.fixture
def jobmanager():
    stub = _JobManager()
    yield stub
    stub.server.shutdown()
    stub.server.server_close()


def test_cancel_waits_until_the_job_is_cancelled(jobmanager, tmp_path):
    jobmanager.cluster(tmp_path).cancel_job(JOB)
    assert jobmanager.requests == [("PATCH", f"/jobs/{JOB}?mode=cancel", None)] and jobmanager.status == "CANCELED"


def test_a_savepoint_is_awaited_and_its_path_returned(jobmanager, tmp_path):
    location = jobmanager.cluster(tmp_path).trigger_savepoint(JOB, tmp_path / "sp")
    assert location == "file:/sp/savepoint-1" and jobmanager.polls == 3
    [(method, path, body)] = jobmanager.requests
    assert (method, path) == ("POST", f"/jobs/{JOB}/savepoints")
    assert body == {"target-directory": str((tmp_path / "sp").resolve()), "cancel-job": False}


def test_stop_with_a_savepoint_returns_once_the_job_ended(jobmanager, tmp_path):
    location = jobmanager.cluster(tmp_path).stop_with_savepoint(JOB, tmp_path / "sp")
    assert location == "file:/sp/savepoint-1" and jobmanager.status == "FINISHED"
    assert jobmanager.requests[0][2] == {"targetDirectory": str((tmp_path / "sp").resolve()), "drain": False}


def test_a_failed_savepoint_names_its_root_cause(tmp_path):
    stub = _JobManager(savepoint_failure="java.util.concurrent.CompletionException: x\nCaused by: "
                                         "org.apache.flink.runtime.checkpoint.CheckpointException: Task not running")
    try:
        with pytest.raises(LocalServiceError, match=rf"(?s)savepoint of job {JOB} failed.*Task not running"):
            stub.cluster(tmp_path).trigger_savepoint(JOB, tmp_path / "sp")
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def test_a_refused_request_says_what_was_refused(jobmanager, tmp_path):
    with pytest.raises(LocalServiceError, match=r"refused PATCH /jobs/b+\?mode=cancel: HTTP 404"):
        jobmanager.cluster(tmp_path).cancel_job("b" * 32)
