"""Shared fixtures: one real Kafka broker per test run, an external invocation counter, Flink helpers."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import cloudpickle
import pytest

from flink_agents_replay.flink.operator import LOG_FILE_ENV
from flink_agents_replay.local.chroma_server import LocalChromaServer
from flink_agents_replay.local.flink_cluster import LocalFlinkCluster
from flink_agents_replay.local.processes import LOCAL_JVM_OPTIONS_ENV, pid_alive
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.kafka import kafka_bootstrap_servers, select_kafka_source
from tests.harness.file_durations import file_seconds, longest_first

# Before any Flink job starts: PyFlink's gateway JVM (the MiniCluster of in-process jobs), and every Flink or PyFlink
# process a test starts, compile with C1 alone. Test jobs are short and the suite starts JVMs by the hundred: a
# MiniCluster process then takes about a third less CPU (bench: 20 -> 14 CPU-s for two small jobs), which on a
# 2-core machine is the suite's time.
os.environ.setdefault("JVM_ARGS", "-XX:TieredStopAtLevel=1")
os.environ.setdefault(LOCAL_JVM_OPTIONS_ENV, "-XX:TieredStopAtLevel=1")  # the local brokers' and clusters' JVMs


#: PyFlink's gateway JVM processes started in this session (see :func:`_keep_pyflink_gateway_process`).
_GATEWAYS: list = []


def _keep_pyflink_gateway_process() -> None:
    """PyFlink drops the ``Popen`` of its gateway JVM, which runs for the whole session: collected mid-run, it is
    reported as a ResourceWarning ("subprocess ... is still running") in whichever test. Keep it, and end it with
    the session (:func:`pytest_unconfigure`)."""
    import pyflink.java_gateway as java_gateway

    launch = java_gateway.launch_gateway_server_process

    def launch_and_keep(env, args):
        _GATEWAYS.append(launch(env, args))
        return _GATEWAYS[-1]

    java_gateway.launch_gateway_server_process = launch_and_keep


_keep_pyflink_gateway_process()
# The operator logs (restore reports) go to a file tests can read: one per pytest-xdist worker (a worker inherits the
# controller's environment, and another worker's restore lines would be read as this one's).
_OPERATOR_LOG = os.path.join(tempfile.mkdtemp(prefix="far-log-"), "operator.log")
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ[LOG_FILE_ENV] = _OPERATOR_LOG
else:
    _OPERATOR_LOG = os.environ.setdefault(LOG_FILE_ENV, _OPERATOR_LOG)

#: The tiers of ``./run tests``: a test's folder under tests/ is its tier and its marker.
_TIERS = ("lint", "unit", "integration")
#: What the ``slow`` marker means.
SLOW_S = 60.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_collection_modifyitems(items):
    """Mark each test with its tier, from its folder, so ``-m`` can pick tiers in any run. Under pytest-xdist the
    longest files go first (:mod:`tests.harness.file_durations`)."""
    tests_dir = Path(__file__).parent
    for item in items:
        path = Path(str(item.path))
        tier = path.relative_to(tests_dir).parts[0] if path.is_relative_to(tests_dir) else None
        if tier in _TIERS:
            item.add_marker(tier)
    if "PYTEST_XDIST_WORKER" in os.environ:
        longest_first(items, file_seconds())


def pytest_runtest_logreport(report):
    """Note a test that ran over :data:`SLOW_S` without the ``slow`` marker (named in the run's summary)."""
    if report.when == "call" and report.duration > SLOW_S and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if _unmarked_slow:
        terminalreporter.section(f"tests over {SLOW_S:.0f} s not marked slow")
        for nodeid, duration in _unmarked_slow:
            terminalreporter.line(f"{duration:7.1f} s  {nodeid}")


@pytest.fixture
def operator_log():
    """Read the operator log lines written from now on (a callable returning them)."""
    start = os.path.getsize(_OPERATOR_LOG) if os.path.exists(_OPERATOR_LOG) else 0

    def lines(closing_of: str | None = None) -> list[str]:
        """Every line, or with ``closing_of`` only that agent's closing summaries: a job of an earlier test may
        close after this test began (its cancellation is asynchronous) and log its own summary here."""
        if not os.path.exists(_OPERATOR_LOG):
            return []
        with open(_OPERATOR_LOG, encoding="utf-8") as log_file:
            log_file.seek(start)
            read = log_file.read().splitlines()
        return read if closing_of is None else [line for line in read if f"agent {closing_of} subtask " in line]

    return lines


@pytest.fixture(autouse=True)
def _environment_as_before_the_test():
    """``os.environ`` as it was before each test. PyFlink's loopback workers (process-mode functions on a
    MiniCluster) run in this process and add the job's worker settings to ``os.environ`` (``PYTHONPATH``,
    ``PYFLINK_GATEWAY_DISABLED``...); a later test's subprocess inheriting them cannot start PyFlink (CI saw
    "launching the PythonGatewayServer during Python UDF execution") or pip sees the wrong packages."""
    before = dict(os.environ)
    yield
    for name in [name for name in os.environ if name not in before]:
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _ship_test_module_by_value(request):
    """Functions defined in a test module reach the Flink worker by value: the worker cannot import tests/."""
    cloudpickle.register_pickle_by_value(request.module)
    yield
    cloudpickle.unregister_pickle_by_value(request.module)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """Bootstrap address of a real broker: $KAFKA_BOOTSTRAP_SERVERS, testcontainers, or a local one."""
    source = select_kafka_source()
    with kafka_bootstrap_servers(source) as bootstrap:
        print(f"\nKafka for this run: {source.value} at {bootstrap}")
        yield bootstrap


@pytest.fixture
def kafka_admin(kafka_bootstrap):
    """A confluent-kafka AdminClient on the test broker (its librdkafka log through Python logging: it lives until
    the broker stops, and would print connection errors at teardown)."""
    from confluent_kafka.admin import AdminClient

    from flink_agents_replay.integrations.kafka.settings import LIBRDKAFKA_LOGGER

    return AdminClient({"bootstrap.servers": kafka_bootstrap, "logger": LIBRDKAFKA_LOGGER})


@pytest.fixture
def new_topic(kafka_admin):
    """Factory: create a uniquely named topic with N partitions; deleted after the test."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []

    def create(partitions: int = 1, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        for future in kafka_admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=30).values():
            future.result(timeout=60)
        created.append(name)
        return name

    yield create
    if created:
        for future in kafka_admin.delete_topics(created, request_timeout=30).values():
            future.result(timeout=60)


@pytest.fixture
def invocation_counter(tmp_path) -> InvocationCounter:
    """A counter that outlives Flink workers (a SQLite file in the test's temp directory)."""
    return InvocationCounter(tmp_path / "invocations.sqlite")


@pytest.fixture
def flink_cluster(tmp_path_factory):
    """Factory of local clusters in temporary work directories; every one is stopped at the end, even on failure."""
    clusters: list[LocalFlinkCluster] = []

    def make(**kwargs) -> LocalFlinkCluster:
        cluster = LocalFlinkCluster(tmp_path_factory.mktemp("flink-cluster"), **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        pids = cluster._live_recorded_pids()
        cluster.stop()
        assert not [pid for pid in pids if pid_alive(pid)], "processes of the cluster survived stop()"


@pytest.fixture
def model_server():
    """Factory of local OpenAI-compatible model + order services (in this process, outside Flink's workers)."""
    from flink_agents_replay.local.model_server import StubModelServer

    servers: list[StubModelServer] = []

    def make(delay_ms: float = 0) -> StubModelServer:
        server = StubModelServer(port=0, delay_ms=delay_ms).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory):
    """The project's own Chroma server (installed once into the cache), on a fresh data directory and a free
    port, stopped at the end of the run."""
    server = LocalChromaServer(tmp_path_factory.mktemp("chroma"), port=0, start_timeout_s=180)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    """The development trace viewer (Arize Phoenix, installed once into the cache) on a free port and a fresh data
    directory, shared by the session's tests (each sends to a project of its own), stopped at the end."""
    from flink_agents_replay.local.phoenix_server import LocalPhoenixServer

    server = LocalPhoenixServer(port=0, work_dir=tmp_path_factory.mktemp("phoenix"), start_timeout_s=300)
    server.start()
    yield server
    server.stop()


def pytest_unconfigure(config):
    """End PyFlink's gateway JVM with the session, its pipes closed (it would otherwise outlive the run's last
    output by a moment and be reported as a running subprocess at exit)."""
    import pyflink.java_gateway as java_gateway

    if java_gateway._gateway is not None:  # its Java objects' finalizers would call the killed JVM at exit
        java_gateway._gateway.close()
    for gateway in _GATEWAYS:
        with gateway:  # closes its pipes and waits for it
            gateway.kill()
