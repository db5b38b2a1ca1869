"""The package as a user gets it: the built wheel in a fresh virtualenv, with no repository and no JDK.

The setting, built once for the module:

* ``python -m build`` makes the sdist and, from it, the wheel (the build hook compiles the checkpoint bridge
  jar into it); ``twine check`` passes on both; the same JDK compiles the jar again byte for byte;
* a fresh virtualenv outside the repository gets the wheel with ``pip install``; every command runs in another
  folder, with no ``PYTHONPATH``: the repository is not on ``sys.path``;
* ``JAVA_HOME`` is a ``jlink`` runtime without ``jdk.compiler`` and ``PATH`` is the venv, that runtime and a folder
  of links to the machine's other tools: ``which javac`` fails;
* ``$FLINK_AGENTS_REPLAY_HOME`` is a read-only mount while jobs run (root ignores file modes): nothing may be
  compiled or cached there;
* a standalone Flink cluster is started from the venv's own pyflink by the venv's CLI, so its TaskManagers
  import the package from the venv.

In it: the user guide's "Testing your own agent" script passes; ``flink run -pym`` of the packaged main job answers
every ticket exactly once while malformed records go to the dead-letter topic and the job never restarts; a
``flink run -pym`` replay from a savepoint of the unchanged agent differs in nothing and a changed agent's in
something; a submission without the connector fails naming its Maven coordinates; and the demo ends with
"every effect once". The broker and the model service are the test's own (outside the setting, as a user's
would be).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from flink_agents_replay.examples.support_triage import make_tickets
from flink_agents_replay.flink.checkpoint_bridge import compile_jar
from flink_agents_replay.jobs.connector import KAFKA_CONNECTOR_COORDINATES
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.local.model_server import StubModelServer
from flink_agents_replay.testing.committed import CommittedReader, poll_until
from tests.harness.doc_blocks import blocks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SIGNING_KEY = "wheel-test-signing-key-0123456789"
AGENT_ID = "wheel-triage"
_JDK_ONLY = re.compile(r"^jdk\.(compiler|javadoc|jshell|jdeps|jlink|jpackage|jartool|jstatd|jcmd|jconsole|jdi|"
                       r"jdwp\.agent|editpad|hotspot\.agent|internal\.(jvmstat|le|opt|ed|md)|incubator\..*)$")
_SAVEPOINT = re.compile(r"(?:Savepoint stored in|Savepoint completed\. Path:) (\S+)")
_JOB_ID = re.compile(r"JobID\s+([0-9a-f]{32})")


@dataclass
class CleanSetting:
    """The venv, the JRE-only PATH, the read-only home; commands run in ``work``, outside the repository."""

    venv: Path
    work: Path
    home: Path
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(self, *command: str, timeout: float = 300, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=self.work, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def cli(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None):
        return self.run(str(self.venv / "bin" / "flink-agents-replay"), *args, timeout=timeout, env=env)


def _without_python_path() -> dict[str, str]:
    """This environment less ``PYTHONPATH``/``PYTHONHOME``: a process-mode PyFlink job run in this process (the
    embedding test) leaves the job's PYTHONPATH in ``os.environ``, and build's isolated environment would then see
    this venv's old setuptools."""
    return {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}


def _build_dist(out: Path) -> tuple[Path, Path]:
    """``python -m build``: the sdist, then the wheel from it; ``twine check`` on both."""
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True,
                           text=True, timeout=900, env=_without_python_path())
    assert built.returncode == 0, (built.stdout + built.stderr)[-5000:]
    sdist, wheel = next(out.glob("*.tar.gz")), next(out.glob("*.whl"))
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                             capture_output=True, text=True, timeout=120, env=_without_python_path())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return sdist, wheel


def _jre(target: Path) -> Path:
    """A Java runtime made by jlink from this machine's JDK, without the compiler."""
    jdk = Path(os.path.realpath(shutil.which("java"))).parent.parent
    modules = subprocess.run([str(jdk / "bin" / "java"), "--list-modules"], check=True, capture_output=True,
                             text=True).stdout.split()
    keep = sorted({m.split("@")[0] for m in modules} - {m.split("@")[0] for m in modules
                                                         if _JDK_ONLY.match(m.split("@")[0])})
    subprocess.run([str(jdk / "bin" / "jlink"), "--add-modules", ",".join(keep), "--output", str(target),
                    "--no-header-files", "--no-man-pages", "--strip-debug"], check=True, timeout=300)
    return target


def _tools_without_a_jdk(target: Path) -> Path:
    """A folder of links to the machine's tools, less everything of a JDK."""
    target.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in sorted(Path(folder).iterdir()):
            real = os.path.realpath(tool)
            if "/jvm/" in real or tool.name.startswith(("java", "jar", "jlink", "python", "pip")):
                continue
            if not (target / tool.name).exists() and os.access(real, os.X_OK):
                (target / tool.name).symlink_to(real)
    return target


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> tuple[Path, Path]:
    return _build_dist(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def clean(dist, tmp_path_factory) -> CleanSetting:
    base = tmp_path_factory.mktemp("clean")
    venv.create(base / "venv", with_pip=True)
    # Without the leaked PYTHONPATH: pip would take this venv's packages for installed ones (CI saw the clean venv
    # without confluent_kafka after the embedding test had run).
    # --no-compile: modules compile when first imported (the venv is writable), not all of Beam's up front (62 -> 34 s).
    # With the dev extra, as the guides say: the testing API's and the local services' dependencies (the demo's).
    installed = subprocess.run([str(base / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
                                f"{dist[1]}[dev]"],
                               capture_output=True, text=True, timeout=900, cwd=base, env=_without_python_path())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    jre = _jre(base / "jre")
    tools = _tools_without_a_jdk(base / "tools")
    home = base / "home"
    home.mkdir()
    subprocess.run(["mount", "--bind", str(home), str(home)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], check=True)
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTHON", "PYFLINK", "VIRTUAL_ENV", "JAVA", "FLINK", "KAFKA", "OPENAI", "CHROMA",
                                   "JDK"))}
    env.update(PATH=os.pathsep.join([str(base / "venv" / "bin"), str(jre / "bin"), str(tools)]),
               JAVA_HOME=str(jre), FLINK_AGENTS_REPLAY_HOME=str(home))
    work = base / "work"
    work.mkdir()
    try:
        yield CleanSetting(base / "venv", work, home, env)
    finally:
        subprocess.run(["umount", str(home)], check=False)


def test_the_setting_is_clean(clean, dist):
    assert clean.run("which", "javac").returncode != 0
    assert "jdk.compiler" not in clean.run("java", "--list-modules").stdout
    where = clean.run("python", "-c", "import sys, flink_agents_replay as p, importlib.metadata as m; "
                      "print(p.__file__); print(m.version('flink-agents-replay'), p.__version__); print(sys.path)")
    module_file, versions, path = where.stdout.splitlines()
    assert module_file.startswith(str(clean.venv)), module_file
    assert len(set(versions.split())) == 1, versions
    assert str(ROOT) not in path
    assert clean.run("touch", str(clean.home / "x")).returncode != 0, "the home must be read-only"

    with zipfile.ZipFile(dist[1]) as wheel:
        shipped = [name for name in wheel.namelist() if name.endswith(".jar")]
        assert shipped == [f"flink_agents_replay/flink/checkpoint_bridge/{compile_jar.packaged_jar_name()}"], shipped
        jar_bytes = wheel.read(shipped[0])
    rebuilt = compile_jar.compile_jar(clean.work.parent / "rebuilt" / "bridge.jar")
    assert rebuilt.read_bytes() == jar_bytes, "the same JDK must give the same jar bytes"


def test_the_user_guide_testing_script_passes(clean, kafka_bootstrap):
    [script] = [block.code for block in blocks(ROOT / "docs/user-guide.md")  # "Testing your own agent"
                if block.run_by == "tests/integration/test_installed_wheel.py"]
    (clean.work / "my_test.py").write_text(script)

    result = clean.run("python", "my_test.py", timeout=600,
                       env={"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                            "FLINK_AGENTS_REPLAY_KAFKA_CONNECTOR": str(kafka_connector_jar())})

    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "every lookup made once" in result.stdout
    assert not list(clean.home.iterdir())


@pytest.fixture(scope="module")
def cluster(clean):
    """A standalone cluster from the venv's pyflink, started by the venv's CLI (its TaskManagers use the venv)."""
    work = clean.work.parent / "flink"
    started = clean.cli("local", "flink", "start", "--work-dir", str(work), "--rest-port", "0",
                        "--taskmanagers", "2")
    assert started.returncode == 0, started.stdout + started.stderr
    exports = dict(re.findall(r"(FLINK_CONF_DIR|FLINK_LIB_DIR)=(\S+)", started.stdout))
    assert f"python.executable: \"{clean.venv}/bin/python" in (Path(exports["FLINK_CONF_DIR"]) / "config.yaml"
                                                              ).read_text()
    flink = str(next(clean.venv.glob("lib/python*/site-packages/pyflink/bin/flink")))
    rest = re.search(r"http://127\.0\.0\.1:\d+", started.stdout).group(0)
    try:
        yield lambda *args, timeout=300: clean.run(flink, *args, timeout=timeout, env=exports), rest
    finally:
        clean.cli("local", "flink", "stop", "--work-dir", str(work))


def _produce(bootstrap: str, topic: str, values: list[bytes | None], partitions: int = 2) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n, value in enumerate(values):
        producer.produce(topic, value, partition=n % partitions)
    assert producer.flush(30) == 0


def _first_record(bootstrap: str, topic: str, *, skip_partition: int) -> tuple[int, bytes]:
    """A record of ``topic`` (partition, value) from a partition other than ``skip_partition``."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"copy-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        for _ in range(600):
            message = consumer.poll(0.1)
            if message is not None and not message.error() and message.partition() != skip_partition:
                return message.partition(), message.value()
        raise AssertionError(f"no record in {topic}")
    finally:
        consumer.close()


def _rest(rest: str, path: str):
    import urllib.request

    with urllib.request.urlopen(rest + path, timeout=10) as response:
        return json.load(response)


def _dead_letter_metric(rest: str, job_id: str, metric: str = "deadLetters") -> int | None:
    """An operator's counter (the parse operator's ``deadLetters`` by default), summed over its subtasks, as the REST
    API reports it."""
    for vertex in _rest(rest, f"/jobs/{job_id}")["vertices"]:
        names = [m["id"] for m in _rest(rest, f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics")
                 if m["id"].endswith(f".{metric}") or m["id"] == metric]
        if names:
            values = _rest(rest, f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics?get={','.join(names)}")
            return int(sum(float(m.get("sum", 0)) for m in values))
    return None


def test_packaged_jobs_from_the_wheel(clean, cluster, kafka_bootstrap, kafka_admin, new_topic):
    flink, rest = cluster
    server = StubModelServer(port=0)
    server.start()
    try:
        _packaged_jobs(clean, flink, rest, server, kafka_bootstrap, new_topic)
    finally:
        server.stop()


def _submit_agent_job(flink, bootstrap: str, topics: dict[str, str], base_url: str, *, connector: bool = True):
    jar = ["--jarfile", str(kafka_connector_jar())] if connector else []
    # Traced to a collector that is down (nothing listens on the port): the replies must not change, and the
    # spans it cannot take are counted as dropped.
    return flink("run", "-d", *jar, "-pym", "flink_agents_replay.jobs.agent_job", "--bootstrap-servers", bootstrap,
                 "--input-topic", topics["input"], "--output-topic", topics["output"], "--agent-id", AGENT_ID,
                 "--parallelism", "2", "--model-base-url", base_url, "--signing-key", SIGNING_KEY,
                 "--checkpoint-interval-ms", "1000", "--capture", "--restart-attempts", "3",
                 "--otlp-endpoint", f"http://127.0.0.1:{_closed_port()}")


def _closed_port() -> int:
    """A port nothing listens on (bound, then released: the system hands it out again only much later)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _packaged_jobs(clean, flink, rest, server, bootstrap, new_topic):  # noqa: PLR0915 - one scenario, told in order
    topics = {"input": new_topic(partitions=2, prefix="wheel-tickets"), "output": new_topic(2, "wheel-replies")}
    dead_letters = f"{topics['input']}.dead-letters"

    # Without the connector, the submission fails before the job exists, naming the Maven coordinates.
    refused = _submit_agent_job(flink, bootstrap, topics, server.base_url, connector=False)
    assert refused.returncode != 0
    assert KAFKA_CONNECTOR_COORDINATES in refused.stdout + refused.stderr, (refused.stdout + refused.stderr)[-3000:]

    first, second = make_tickets(24, 6), make_tickets(24, 6, start=24)
    bad = [b"not json at all", b'{"customer": 7, "text": "a number as the key"}', b'["a", "list"]']
    _produce(bootstrap, topics["input"], [json.dumps(t).encode() for t in first[:12]] + bad
             + [json.dumps(t).encode() for t in first[12:]])
    submitted = _submit_agent_job(flink, bootstrap, topics, server.base_url)
    assert submitted.returncode == 0, (submitted.stdout + submitted.stderr)[-4000:]
    job_id = _JOB_ID.search(submitted.stdout + submitted.stderr).group(1)
    replies = CommittedReader(bootstrap, topics["output"], decode=json.loads)
    poll_until(lambda: len(replies.poll()) >= len(first), 180, lambda: f"{len(replies.rows)} replies")

    taken = flink("savepoint", job_id, str(clean.work.parent / "savepoints"))
    assert taken.returncode == 0, taken.stdout + taken.stderr
    savepoint = _SAVEPOINT.search(taken.stdout).group(1)
    _produce(bootstrap, topics["input"], [json.dumps(t).encode() for t in second])
    poll_until(lambda: len(replies.poll()) >= len(first) + len(second), 180, lambda: f"{len(replies.rows)} replies")

    letters = CommittedReader(bootstrap, dead_letters, decode=json.loads)
    poll_until(lambda: len(letters.poll()) >= len(bad), 60, lambda: f"{letters.rows}")
    poll_until(lambda: _dead_letter_metric(rest, job_id) == len(bad), 60,
               lambda: f"deadLetters metric: {_dead_letter_metric(rest, job_id)}")
    # The collector is down: spans are dropped, counted, and nothing else changed (replies checked below).
    poll_until(lambda: (_dead_letter_metric(rest, job_id, "spans_dropped") or 0) > 0, 60,
               lambda: f"spans_dropped: {_dead_letter_metric(rest, job_id, 'spans_dropped')}")
    assert _dead_letter_metric(rest, job_id, "spans_exported") == 0
    exceptions = _rest(rest, f"/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"]
    flink("cancel", job_id)

    # Every ticket answered exactly once (read_committed), every model request made once.
    answered = Counter(row["ticket_id"] for row in replies.poll())
    assert answered == Counter(t["ticket_id"] for t in first + second), answered
    assert server.stats().repeated == 0
    # Each malformed record is a dead letter with its reason, partition and offset; the job never restarted.
    assert sorted(letter["value"] for letter in letters.rows) == sorted(value.decode() for value in bad)
    reasons = {letter["value"]: letter["reason"] for letter in letters.rows}
    assert reasons[bad[0].decode()].startswith("not JSON")
    assert reasons[bad[1].decode()] == "key field 'customer' is not a string: 7"
    assert reasons[bad[2].decode()] == "not a JSON object: a list"
    assert {(letter["topic"], letter["partition"]) for letter in letters.rows} <= {
        (topics["input"], 0), (topics["input"], 1)}
    assert len({(letter["partition"], letter["offset"]) for letter in letters.rows}) == len(bad)
    assert exceptions == [], "the job failed (and restarted) on the way"

    # Someone with topic access puts junk into the capture, and a genuine record copied to another partition.
    capture = f"flink-agents-replay.{AGENT_ID}.capture"
    _produce(bootstrap, capture, [b"junk in the capture"], partitions=1)
    partition, value = _first_record(bootstrap, capture, skip_partition=0)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(capture, value, partition=(partition + 1) % 128)
    assert producer.flush(30) == 0

    # Replays of the savepoint with flink run -pym: the unchanged agent differs in nothing, a changed one does;
    # both go past the two capture records that do not verify, which become their dead letters.
    def replay(name: str, *agent: str):
        ran = flink("run", "-s", savepoint, "--jarfile", str(kafka_connector_jar()), "-pym",
                    "flink_agents_replay.jobs.replay_job", "--replay-name", name, "--agent-id", AGENT_ID,
                    "--bootstrap-servers", bootstrap, "--output-topic", topics["output"],
                    "--model-base-url", server.base_url, "--signing-key", SIGNING_KEY, *agent, timeout=600)
        assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
        report = clean.work / f"{name}.json"
        diff = clean.cli("diff", "--bootstrap-servers", bootstrap, "--agent-id", AGENT_ID, "--signing-key",
                         SIGNING_KEY, "--replay", f"flink-agents-replay.{AGENT_ID}.capture.replay-{name}",
                         "--json", str(report))
        assert diff.returncode == 0, diff.stdout + diff.stderr
        return json.loads(report.read_text())

    unchanged = replay("unchanged", "--side-effects", "*=recorded")
    changed = replay("changed", "--agent", "flink_agents_replay.examples.support_triage:support_triage_agent_v2",
                     "--side-effects", "llm=live")
    assert unchanged["summary"]["changed"] == 0 and unchanged["summary"]["same"] > 0, unchanged["summary"]
    replay_letters = CommittedReader(bootstrap, f"{topics['output']}.replay-unchanged.dead-letters", decode=json.loads)
    poll_until(lambda: len(replay_letters.poll()) >= 2, 60, lambda: f"{replay_letters.rows}")
    assert sorted(letter["reason"].split(" (")[0].split(":")[0] for letter in replay_letters.rows) == [
        "capture record", "capture record"], replay_letters.rows
    assert any("copied to partition" in letter["reason"] for letter in replay_letters.rows), replay_letters.rows
    assert changed["summary"]["changed"] >= 1, changed["summary"]
    assert not list(clean.home.iterdir()), "nothing is written to the (read-only) home"


def test_the_demo_runs_from_the_wheel(clean, phoenix):
    """The README's first command, as an installed user runs it: a TaskManager is SIGKILLed mid-stream and every
    effect still happens once (its verdict covers calls, replies and memories); it stops all it started. Its runs'
    traces go to Phoenix (here the session's, given with --trace-viewer-url, so that the page outlives the demo), and
    headless Chromium shows the trace of a run the kill cut short with the run's span names."""
    from tests.harness.browser import rendered_dom
    from tests.harness.processes import service_processes

    before = service_processes("far-demo-")  # the demo's work directory: other tests' services may run meanwhile
    home = os.environ.get("FLINK_AGENTS_REPLAY_HOME") or str(Path.home() / ".cache" / "flink-agents-replay")
    result = clean.cli("demo", "--tickets", "80", "--customers", "16", "--trace-viewer-url", phoenix.url,
                       timeout=900, env={"FLINK_AGENTS_REPLAY_HOME": home})  # writable: its broker's jars, Chroma
    print(result.stdout[-3000:])
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    table = dict(re.findall(r"^(\w[\w -]+?)\s{2,}(.+)$", result.stdout, re.MULTILINE))
    assert table["verdict"] == "OK: every effect once", result.stdout[-3000:]
    assert "Traceback" not in result.stdout + result.stderr, "the demo's terminal shows one line per fault, not traces"
    assert "with SIGKILL" in table["TaskManager killed"]
    assert int(table["journal read at restore"].split()[0]) > 0 and int(table["actions reused"].split()[0]) > 0
    assert int(re.search(r"(\d+) pruned", table["journal records"]).group(1)) > 0
    assert int(re.search(r"(\d+) replies mention", table["long-term memory"]).group(1)) > 0
    assert int(table["approvals asked"].split()[0]) > 0 and "0 runs resumed twice" in table["decisions"]
    paid, replies = map(int, re.findall(r"\d+", table["refunds paid"])[:2])
    assert paid == replies > 0, table["refunds paid"]
    assert service_processes("far-demo-") - before == set(), "the demo left Kafka, Flink or Chroma processes running"
    assert table["traces"].startswith("80 runs, one trace each"), table["traces"]
    page = table["a recovered run"]
    assert page.startswith(phoenix.url), page
    names = ("invoke_agent support-triage", "action classify", "action draft_reply", "reused ")
    dom = rendered_dom(page, timeout_s=60, expect=names)
    assert all(name in dom for name in names), (page, dom[-2000:])
