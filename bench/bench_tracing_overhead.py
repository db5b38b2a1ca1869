"""Tracing overhead: the journal-overhead workload with tracing off and on, side by side (issue 37).

The workload and jobs of ``bench_journal_overhead.py`` (its ``_run_variant``: one subtask, ``max_concurrent_runs``
8, 32 keys, 2 chained actions of 1 call each, journal ``per_run``, a checkpoint a second, an unbounded Kafka input,
throughput from the end of the first wave to the last output), with ``tracing`` off and on, content capture off
(the default), each tracing-on job under a service name (a receiver's project) of its own. Two receivers, both on
this machine: a real local Arize Phoenix (:class:`~flink_agents_replay.local.phoenix_server.LocalPhoenixServer`,
started once in a temporary work directory, stopped at the end), and a minimal OTLP/HTTP receiver (this script with
``--serve-otlp``: decodes each request, counts spans and traces per service, answers at once), which separates the
operator's cost from the receiver's: on 2 cores they share the CPU. The variants take turns within each round (the
order rotates), and a round's ratio is its on job's runs/s over its off job's.

Spans must arrive, or a row proves nothing: after each tracing-on job the benchmark waits for the receiver to go
idle and asserts that it holds exactly 5 spans (the run, 2 actions, 2 tool calls) for each of the job's runs, one
trace per run. The operator's ``spans_exported`` and ``spans_dropped`` counters are read from the MiniCluster's REST
API while the job runs (last values seen before it is cancelled: they lag the last spans by up to a checkpoint). The
receiver's CPU per run (``/proc``, from the job's start until its ingestion went idle) is shown beside the Flink
JVM's.

    .venv/bin/python bench/bench_tracing_overhead.py --quick   # 1 round, ~4 minutes
    .venv/bin/python bench/bench_tracing_overhead.py           # 3 rounds, 20 ms calls, ~9 minutes
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import _harness as h
import bench_journal_overhead as jo

#: Spans of one run of the benchmark agent: the run, its 2 actions, their 2 tool calls.
SPANS_PER_RUN = 5
OFF, PHOENIX, SINK = "tracing off", "on, Phoenix", "on, OTLP sink"
#: Tracing-on variants' throughput against off, to size their first job (Phoenix ingests ~80 spans/s per core).
_GUESS = {PHOENIX: 0.25, SINK: 0.9}


class SpanCounters(h.BackgroundLoop):
    """The running job's ``spans_exported`` and ``spans_dropped`` (summed over subtasks), polled from the
    MiniCluster's REST API on ``port`` every ``interval_s``; the last values seen stay in :attr:`values`."""

    NAMES = ("spans_exported", "spans_dropped")

    def __init__(self, port: int, interval_s: float = 0.5):
        super().__init__("span-counters")
        self.base = f"http://127.0.0.1:{port}"
        self.interval_s = interval_s
        self.values: dict[str, int] = {}
        self._ids: list[tuple[str, str]] = []  # (vertex path, metric id)

    def _get(self, path: str):
        with urllib.request.urlopen(self.base + path, timeout=2) as answer:
            return json.load(answer)

    def _poll(self) -> None:
        if not self._ids:
            jobs = [j["jid"] for j in self._get("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
            for job in jobs[:1]:
                for vertex in self._get(f"/jobs/{job}")["vertices"]:
                    path = f"/jobs/{job}/vertices/{vertex['id']}/subtasks/metrics"
                    # Flink rewrites characters of the operator name in metric ids: found by their ending
                    self._ids += [(path, m["id"]) for m in self._get(path)
                                  if m["id"].endswith(tuple(f".flink_agents_replay.{n}" for n in self.NAMES))]
        values: dict[str, int] = defaultdict(int)
        for path in {p for p, _ in self._ids}:
            wanted = ",".join(i for p, i in self._ids if p == path)
            for metric in self._get(f"{path}?get={wanted}&agg=sum"):
                values[metric["id"].rsplit(".", 1)[-1]] += int(float(metric["sum"]))
        if values:
            self.values = dict(values)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._poll()
            except (OSError, ValueError, KeyError):  # not up yet, or cancelled: keep the last values
                pass


@dataclass
class Arrived:
    """What a receiver holds for one project (service): spans, traces, spans per trace, span names' first word."""

    spans: int
    traces: int
    spans_per_trace: set[int]
    names: Counter


def serve_otlp() -> None:
    """A minimal OTLP/HTTP receiver on a free port of 127.0.0.1 (printed as ``port N``): decodes each export request
    and counts its spans per service; ``GET /arrived?service=S`` answers what it holds for ``S`` as JSON.

    It stands for a collector on another machine, so it yields the CPU to the job (``os.nice``): on these 2-core
    machines its decoding would otherwise count against the job's throughput."""
    from urllib.parse import parse_qs, urlparse

    os.nice(10)

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    lock = threading.Lock()
    seen: dict[str, tuple[Counter, Counter]] = defaultdict(lambda: (Counter(), Counter()))  # names, traces

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest.FromString(body)
            with lock:
                for resource_spans in request.resource_spans:
                    service = next((a.value.string_value for a in resource_spans.resource.attributes
                                    if a.key == "service.name"), "")
                    names, traces = seen[service]
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            names[span.name.split(" ", 1)[0]] += 1
                            traces[span.trace_id] += 1
            self._answer(b"", "application/x-protobuf")

        def do_GET(self) -> None:  # noqa: N802
            service = parse_qs(urlparse(self.path).query)["service"][0]
            with lock:
                names, traces = seen.get(service, (Counter(), Counter()))
                answer = {"spans": sum(names.values()), "traces": len(traces),
                          "spans_per_trace": sorted(set(traces.values())), "names": dict(names)}
            self._answer(json.dumps(answer).encode(), "application/json")

        def _answer(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


class PhoenixReceiver:
    """A local Phoenix server in a temporary work directory; a project per job, read back with ``read_spans``."""

    def __init__(self) -> None:
        from flink_agents_replay.local.phoenix_server import LocalPhoenixServer

        self.server = LocalPhoenixServer(port=0, work_dir=tempfile.mkdtemp(prefix="far-bench-phoenix-"))
        self.url, self.pid = "", 0

    def start(self) -> None:
        status = self.server.start()
        self.url, self.pid = status.url, status.pid

    def stop(self) -> None:
        self.server.stop()

    def arrived(self, project: str) -> Arrived:
        from flink_agents_replay.local.phoenix_server import read_spans

        spans = read_spans(self.url, project)
        traces = Counter(span["trace_id"] for span in spans)
        return Arrived(len(spans), len(traces), set(traces.values()),
                       Counter(span["name"].split(" ", 1)[0] for span in spans))


class SinkReceiver:
    """:func:`serve_otlp` in a process of its own."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.url, self.pid = "", 0

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-otlp"],
                                        stdout=subprocess.PIPE, text=True)
        port = int(self.process.stdout.readline().split()[1])
        self.url, self.pid = f"http://127.0.0.1:{port}", self.process.pid

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)

    def arrived(self, project: str) -> Arrived:
        with urllib.request.urlopen(f"{self.url}/arrived?service={project}", timeout=10) as answer:
            got = json.load(answer)
        return Arrived(got["spans"], got["traces"], set(got["spans_per_trace"]), Counter(got["names"]))


class ExporterCpu(h.BackgroundLoop):
    """The CPU of the job's exporter processes (``traces/exporter_process.py``, children of the Flink JVM), polled
    every ``interval_s``: the last value seen per process, since they exit when the job is cancelled."""

    MODULE = "flink_agents_replay.traces.exporter_process"

    def __init__(self, interval_s: float = 0.2):
        super().__init__("exporter-cpu")
        self.interval_s = interval_s
        self.seen: dict[int, float] = {}
        self._jvms = {pid for pid in h._children(os.getpid()) if "PythonGatewayServer" in h._cmdline(pid)}

    def _exporters(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and self.MODULE in h._cmdline(int(entry)):
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError):
                    continue
                if parent in self._jvms:
                    found.append(int(entry))
        return found

    def _run(self) -> None:
        while True:
            for pid in self._exporters():
                cpu = h._cpu_seconds(pid)
                if cpu == cpu:  # not NaN: it was still there
                    self.seen[pid] = max(self.seen.get(pid, 0.0), cpu)
            if self._stop.wait(self.interval_s):
                return

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


@dataclass
class Traced:
    """What a tracing-on job sent and where it arrived."""

    arrived: Arrived  # in the receiver, the job's project
    exported: int | None  # the operator's counters, last seen over REST
    dropped: int | None
    receiver_cpu_s: float  # the receiver's CPU from the job's start until its ingestion went idle
    exporter_cpu_s: float  # the job's exporter processes' CPU, the job's whole life
    ingest_wait_s: float  # after the job, until every span was there


def _wait_for_spans(receiver, project: str, expected: int, timeout_s: float) -> tuple[Arrived, float]:
    """What ``receiver`` holds for ``project`` once it holds ``expected`` spans (or ``timeout_s`` passed), and the
    CPU it had spent when its ingestion went idle (less than 10 % of a core over half a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        before = h._cpu_seconds(receiver.pid)
        time.sleep(0.5)
        cpu = h._cpu_seconds(receiver.pid)
        if cpu - before < 0.05 or time.monotonic() > deadline:
            arrived = receiver.arrived(project)
            if arrived.spans >= expected or time.monotonic() > deadline:
                return arrived, cpu


def _check_spans(arrived: Arrived, runs: int, project: str) -> None:
    """Assert one trace of :data:`SPANS_PER_RUN` spans per run: a run span, 2 actions, 2 tool calls."""
    problems = []
    if arrived.spans != runs * SPANS_PER_RUN:
        problems.append(f"{arrived.spans} spans arrived, expected {runs} runs x {SPANS_PER_RUN}")
    if arrived.traces != runs or arrived.spans_per_trace != {SPANS_PER_RUN}:
        problems.append(f"{arrived.traces} traces (expected {runs}), spans per trace {sorted(arrived.spans_per_trace)}")
    if arrived.names != Counter({"invoke_agent": runs, "action": 2 * runs, "execute_tool": 2 * runs}):
        problems.append(f"span names {dict(arrived.names)}")
    if problems:
        raise AssertionError(f"tracing-on job, project {project}: " + "; ".join(problems))


def _run_job(bootstrap: str, name: str, delay_ms: float, runs: int, args, label: str,
             receivers: dict) -> tuple[jo.Measured, Traced | None]:
    from flink_agents_replay.local.processes import free_port

    overrides: dict = {"durability": "per_run"}
    receiver, project = receivers.get(name), None
    if receiver is not None:
        project = f"bench-tracing-{uuid.uuid4().hex[:8]}"
        overrides["tracing"] = {"endpoint": receiver.url, "service_name": project}
    port = free_port()
    cpu_before = h._cpu_seconds(receiver.pid) if receiver else 0.0
    with SpanCounters(port) as counters, ExporterCpu() as exporter_cpu:
        measured = jo._run_variant(bootstrap, name, overrides, delay_ms, runs, args, label,
                                   flink_config={"rest.port": str(port),
                                                 "metrics.fetcher.update-interval": "500"})
    if receiver is None:
        return measured, None
    ended = time.monotonic()
    arrived, cpu_after = _wait_for_spans(receiver, project, runs * SPANS_PER_RUN, args.ingest_timeout_s)
    waited = time.monotonic() - ended
    _check_spans(arrived, runs, project)
    return measured, Traced(arrived, counters.values.get("spans_exported"), counters.values.get("spans_dropped"),
                            cpu_after - cpu_before, exporter_cpu.seconds, waited)


def _rate(jobs: list[h.JobResult]) -> float:
    return sum(j.runs for j in jobs) / sum(j.seconds for j in jobs)


def _rows(delay_ms: float, names: list[str], measured: dict, traced: dict) -> list[list]:
    off = [m.job for m in measured[(OFF, delay_ms)]]
    off_latencies = sorted(t for j in off for t in j.latencies)
    rows = []
    for name in names:
        results = measured[(name, delay_ms)]
        jobs = [m.job for m in results]
        latencies = sorted(t for j in jobs for t in j.latencies)
        ratios = [_rate([on]) / _rate([base]) for on, base in zip(jobs, off, strict=True)]
        spans = traced.get((name, delay_ms), [])
        all_runs = sum(len(j.stamps) for j in jobs)  # every run of the jobs, the first wave's too
        base = name == OFF

        def added(p: float, latencies=latencies, base=base) -> str:
            return "-" if base else f"{(h.percentile(latencies, p) - h.percentile(off_latencies, p)) * 1000:+.1f}"

        rows.append([
            name, delay_ms, sum(j.runs for j in jobs), _rate(jobs),
            "-" if base else f"{_rate(jobs) / _rate(off):.3f}",
            "-" if base else ", ".join(f"{r:.3f}" for r in ratios),
            "-" if base else f"{min(ratios):.3f}..{max(ratios):.3f}",
            h.percentile(latencies, 0.5) * 1000, h.percentile(latencies, 0.95) * 1000,
            h.percentile(latencies, 0.99) * 1000, added(0.5), added(0.95), added(0.99),
            sum(j.flink_cpu_s for j in jobs) / sum(j.runs for j in jobs) * 1000,
            f"{sum(t.exporter_cpu_s for t in spans) / all_runs * 1000:.2f}" if spans else "-",
            f"{sum(t.receiver_cpu_s for t in spans) / all_runs * 1000:.2f}" if spans else "-",
            f"{sum(t.arrived.spans for t in spans)} / {SPANS_PER_RUN * all_runs}" if spans else "-",
            "/".join(str(t.exported) for t in spans) if spans else "-",
            "/".join(str(t.dropped) for t in spans) if spans else "-",
            f"{sum(m.load for m in results) / len(results):.1f}",
        ])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    parser.add_argument("--seconds", type=float, help="target measured seconds per job (default 10, --quick 4)")
    parser.add_argument("--delays-ms", type=float, nargs="+", default=[20.0], help="call times (ms; default 20)")
    parser.add_argument("--receivers", nargs="+", choices=["phoenix", "sink"], default=["phoenix", "sink"],
                        help="where tracing-on jobs export (default both)")
    parser.add_argument("--concurrency", type=int, default=8, help="max_concurrent_runs (default 8)")
    parser.add_argument("--keys", type=int, default=32, help="distinct keys in the input (default 32)")
    parser.add_argument("--poll-interval-ms", type=int, default=5, help="operator poll_interval_ms (default 5)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)")
    parser.add_argument("--ingest-timeout-s", type=float, default=300.0,
                        help="how long to wait for a receiver to hold a job's spans (default 300)")
    parser.add_argument("--serve-otlp", action="store_true", help=argparse.SUPPRESS)  # the sink's own process
    args = parser.parse_args()
    if args.serve_otlp:
        serve_otlp()
        return
    rounds = args.rounds or (1 if args.quick else 3)
    target_s = args.seconds or (4.0 if args.quick else 10.0)
    receivers = {name: make() for option, name, make in (("phoenix", PHOENIX, PhoenixReceiver),
                                                          ("sink", SINK, SinkReceiver)) if option in args.receivers}
    names = [OFF, *receivers]

    print(h.machine_note())
    print(f"# {rounds} round(s), concurrency {args.concurrency}, {args.keys} keys, journal per_run, checkpoints every "
          f"{args.checkpoint_interval_ms} ms, ~{target_s:g} s measured per job", flush=True)
    measured: dict[tuple[str, float], list[jo.Measured]] = defaultdict(list)
    traced: dict[tuple[str, float], list[Traced]] = defaultdict(list)
    began = time.monotonic()
    try:
        for name, receiver in receivers.items():
            receiver.start()
            print(f"# {name}: pid {receiver.pid} at {receiver.url} [{time.monotonic() - began:.0f} s]", flush=True)
        with h.broker() as bootstrap:
            h.warm_up_broker(bootstrap, 15 if args.quick else 30)
            for name in receivers:  # also warms the receivers and the exporter up
                _run_job(bootstrap, name, 0.0, 200, args, "warmup", receivers)
            print(f"# warm-up jobs done at {time.monotonic() - began:.0f} s", flush=True)
            for round_index in range(rounds):
                order = names[round_index % len(names):] + names[:round_index % len(names)]
                for delay_ms in args.delays_ms:
                    for name in order:
                        previous = [m.job for m in measured[(name, delay_ms)]]
                        runs = jo._job_size(name, {}, previous, delay_ms, args.concurrency, target_s)
                        if not previous:
                            runs = max(60, int(runs * _GUESS.get(name, 1.0)))
                        m, t = _run_job(bootstrap, name, delay_ms, runs, args, f"tracing{round_index}", receivers)
                        measured[(name, delay_ms)].append(m)
                        r = m.job
                        line = (f"# round {round_index + 1} {name:>13} {delay_ms:4g} ms: {r.runs:5d} runs in "
                                f"{r.seconds:6.2f} s = {_rate([r]):7.1f} runs/s, p50 "
                                f"{h.percentile(r.latencies, 0.5) * 1000:.1f} ms, Flink CPU "
                                f"{r.flink_cpu_s / r.runs * 1000:.2f} ms/run ("
                                + ", ".join(f"{group} {cpu / r.runs * 1000:.2f}"
                                            for group, cpu in sorted(r.flink_cpu_by_group_s.items())) + ")")
                        if t:
                            traced[(name, delay_ms)].append(t)
                            line += (f", {t.arrived.spans} spans ({t.arrived.traces} traces) there "
                                     f"{t.ingest_wait_s:.1f} s after the job, REST exported {t.exported} dropped "
                                     f"{t.dropped}, exporter CPU {t.exporter_cpu_s / runs * 1000:.2f} ms/run, "
                                     f"receiver CPU {t.receiver_cpu_s / runs * 1000:.2f} ms/run")
                        print(f"{line} [{time.monotonic() - began:.0f} s, load {h.load1():.1f}]", flush=True)
    finally:
        for receiver in receivers.values():
            receiver.stop()

    h.print_table(
        f"Tracing overhead: 1 subtask, max_concurrent_runs={args.concurrency}, 2 actions x 1 call per run, journal "
        f"per_run, {rounds} interleaved round(s), content capture off",
        ["variant", "call ms", "runs", "runs/s", "on/off", "on/off per round", "range", "p50 ms", "p95 ms", "p99 ms",
         "p50 added", "p95 added", "p99 added", "Flink CPU ms/run", "exporter CPU ms/run", "receiver CPU ms/run",
         "spans there / expected",
         "exported (REST)", "dropped (REST)", "load"],
        [row for delay_ms in args.delays_ms for row in _rows(delay_ms, names, measured, traced)])
    print("on/off = runs/s with tracing on / off (all rounds' runs over their seconds); per round: that round's on job "
          "over its off job")
    print("latency = first action began -> output left the operator, measured window; added = on's percentile minus "
          "off's (ms)")
    print(f"spans there = in the receiver, every job's project, asserted = {SPANS_PER_RUN} x the job's runs (one trace "
          "per run); exported / dropped = the operator's counters per job, last read over REST before the job was "
          "cancelled; exporter CPU = the job's exporter processes, its whole life, per run; receiver CPU = its process "
          "from the job's start until its ingestion went idle, per run")


if __name__ == "__main__":
    main()
