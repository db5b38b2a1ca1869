"""``flink-agents-replay``: the command line.

    flink-agents-replay local kafka start [--port N] [--work-dir DIR]
    flink-agents-replay local kafka status|stop [--work-dir DIR]
    flink-agents-replay local flink start [--rest-port N] [--taskmanagers N] [--work-dir DIR]
    flink-agents-replay local flink status|stop [--work-dir DIR]
    flink-agents-replay local model start [--port N] [--delay-ms N] [--work-dir DIR]
    flink-agents-replay local model status|stop [--work-dir DIR]
    flink-agents-replay local chroma start [--port N] [--work-dir DIR]
    flink-agents-replay local chroma status|stop [--work-dir DIR]
    flink-agents-replay local phoenix start [--port N] [--work-dir DIR]
    flink-agents-replay local phoenix status|stop [--work-dir DIR]
    flink-agents-replay local phoenix install
    flink-agents-replay local jars fetch [kafka-broker|flink-connectors|flink-kubernetes-operator-api]
    flink-agents-replay inspect --bootstrap-servers HOST:PORT --topic TOPIC [--key KEY --key-type STRING]
                                [-X NAME=VALUE ...]   (-X: a Kafka client setting, SASL, SSL...; tickets, diff too)
    flink-agents-replay demo [--tickets N] [--parallelism N] [--model-delay-ms N]
    flink-agents-replay tickets feed [--count N] [--start N] [--topic tickets] [--bootstrap-servers HOST:PORT]
    flink-agents-replay tickets replies [--topic replies] [--bootstrap-servers HOST:PORT]
    flink-agents-replay diff --production CAPTURE --replay REPLAY_CAPTURE [--agent-id NAME] [--html FILE]
                             [--json FILE] [--fail-on-diff] [--price MODEL=IN/OUT ... | --prices FILE]
                             [--trace-url-template 'http://jaeger:16686/trace/{trace_id}' | --trace-viewer-url URL]
    flink-agents-replay memory diff --store URL --namespace NS --replay NAME --as-of EPOCH [--json FILE]
    flink-agents-replay memory clean --store URL --replay NAME
    flink-agents-replay memory compact --store URL --namespace NS --oldest-retained EPOCH|TIME
    flink-agents-replay waits list --waits-topic W [--key K] [--all] [--json] [--bootstrap-servers HOST:PORT]
    flink-agents-replay waits decide WAIT_ID (--approve | --deny) [--reason R] [--value JSON] [--by B]
                                    --signals-topic S (--waits-topic W | --key K) [--bootstrap-servers HOST:PORT]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flink_agents_replay.core.errors import ConfigError, FlinkAgentsReplayError
from flink_agents_replay.core.keygroups import SUPPORTED_KEY_TYPES
from flink_agents_replay.local.errors import LocalServiceError

if TYPE_CHECKING:
    from flink_agents_replay.integrations.kafka.settings import KafkaSettings

__all__ = ["main"]


def _service(service, action: str, after_start) -> int:
    """start / stop / status of a local service; status exits 3 when it is not running (like systemctl)."""
    if action == "start":
        already = service.status().running
        status = service.start()
        print(("already " if already else "") + status.describe())
        after_start(status)
    elif action == "stop":
        print("stopped" if service.stop() else "was not running")
    else:
        status = service.status()
        print(status.describe())
        return 0 if status.running else 3
    return 0


def _kafka(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.kafka_broker import LocalKafkaBroker

    return _service(LocalKafkaBroker(args.work_dir, port=args.port), args.action,
                    lambda status: print(f"export KAFKA_BOOTSTRAP_SERVERS={status.bootstrap_servers}"))


def _flink(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.flink_cluster import LocalFlinkCluster, pyflink_home

    cluster = LocalFlinkCluster(args.work_dir, rest_port=args.rest_port, taskmanagers=args.taskmanagers)

    def how_to_submit(_status) -> None:
        print("# submit jobs with Flink's client from the pyflink package, in this environment:")
        print(f"export FLINK_CONF_DIR={cluster.conf_dir} FLINK_LIB_DIR={cluster.lib_dir}")
        print(f"# {pyflink_home() / 'bin' / 'flink'} run -d --jarfile <Kafka connector jar> "
              "-pym flink_agents_replay.jobs.agent_job ...")

    return _service(cluster, args.action, how_to_submit)


def _model(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.model_server import LocalModelServer

    return _service(LocalModelServer(args.work_dir, port=args.port, delay_ms=args.delay_ms), args.action,
                    lambda status: print(f"export OPENAI_BASE_URL={status.base_url}"))


def _chroma(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.chroma_server import LocalChromaServer

    return _service(LocalChromaServer(args.work_dir, port=args.port), args.action,
                    lambda status: print(f"export CHROMA_URL={status.url}"))


def _phoenix(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.phoenix_server import LocalPhoenixServer, install_phoenix

    if args.action == "install":  # ahead of time (a test run installs it while its first tiers run)
        print(f"phoenix: {install_phoenix()}")
        return 0
    return _service(LocalPhoenixServer(port=args.port, work_dir=args.work_dir), args.action,
                    lambda status: print(f"export OTEL_EXPORTER_OTLP_ENDPOINT={status.otlp_endpoint}"))


def _non_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _jars(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.jars import FLINK_CONNECTORS, KAFKA_BROKER, fetch_jars

    for bundle in args.bundles or [KAFKA_BROKER, FLINK_CONNECTORS]:
        print(f"{bundle}: {fetch_jars(bundle)}")
    return 0


def _kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The user's Kafka settings: ``--bootstrap-servers`` and every ``-X NAME=VALUE``."""
    from flink_agents_replay.integrations.kafka.settings import KafkaSettings

    settings = {"bootstrap.servers": args.bootstrap_servers}
    for setting in args.kafka_settings:
        name, equals, value = setting.partition("=")
        if not equals or not name.strip():
            raise ConfigError(f"-X {setting!r}: give a Kafka client setting as NAME=VALUE (e.g. -X "
                             "security.protocol=SASL_SSL)")
        settings[name.strip()] = value
    return KafkaSettings.of(settings)


def _add_kafka_settings_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-X", "--kafka-setting", dest="kafka_settings", action="append", default=[],
                        metavar="NAME=VALUE", help="a Kafka client setting passed to every client (SASL, SSL...), "
                        "repeatable: -X security.protocol=SASL_SSL -X sasl.mechanism=PLAIN ...")


def _inspect(args: argparse.Namespace) -> int:
    from flink_agents_replay.storage.journal.inspect import key_records, summarize_topic

    kafka = _kafka_settings(args)
    if args.key is None:
        summary = summarize_topic(kafka, args.topic)
        used = [p for p in summary if p.high > 0]
        print(f"journal topic {args.topic}: {len(summary)} partitions, {sum(p.records for p in summary)} records "
              f"stored, {sum(p.low for p in summary)} pruned")
        print(f"{'partition':>9}  {'low':>10}  {'high':>10}  {'records':>8}")
        for p in used if not args.all_partitions else summary:
            print(f"{p.partition:>9}  {p.low:>10}  {p.high:>10}  {p.records:>8}")
        return 0
    key = int(args.key) if args.key_type in ("LONG", "INT") else args.key
    records = key_records(kafka, args.topic, key, args.key_type)
    print(f"key {key!r}: {len(records)} records")
    print(f"{'offset':>8}  {'seq':>6}  {'action':<24}  {'kind':<10}  {'age s':>8}")
    for r in records:
        age = "?" if r.age_s is None else f"{r.age_s:.1f}"
        print(f"{r.offset:>8}  {r.seq:>6}  {r.action:<24}  {r.kind:<10}  {age:>8}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from flink_agents_replay.cli.demo import format_table, run_demo

    result = run_demo(tickets=args.tickets, customers=args.customers, parallelism=args.parallelism,
                      model_delay_ms=args.model_delay_ms, feed_per_second=args.feed_per_second,
                      job_module=args.job_module, trace_viewer_url=args.trace_viewer_url)
    print()
    print(format_table(result))
    return 0 if result.ok else 1


def _tickets(args: argparse.Namespace) -> int:
    import json
    from collections import Counter

    from confluent_kafka import KafkaException, Producer

    from flink_agents_replay.examples.support_triage import make_tickets, produce_tickets
    from flink_agents_replay.integrations.kafka.admin import ensure_topics

    kafka = _kafka_settings(args)
    try:
        if args.action == "feed":
            topic = args.topic or "tickets"
            ensure_topics(kafka, [topic], partitions=2, replication_factor=1)
            producer = Producer(kafka.producer_config(durable=True, what="tickets feed"))
            tickets = make_tickets(args.count, args.customers, start=args.start)
            produce_tickets(producer, topic, tickets)
            if producer.flush(60):
                raise FlinkAgentsReplayError(f"Kafka at {args.bootstrap_servers} did not acknowledge the tickets")
            print(f"wrote tickets {tickets[0]['ticket_id']}..{tickets[-1]['ticket_id']} to {topic}")
            return 0
        from flink_agents_replay.testing.committed import CommittedReader

        if args.kafka_settings:  # CommittedReader connects with bootstrap servers only
            raise ConfigError("tickets replies takes no -X settings yet: it reads with --bootstrap-servers only")
        with CommittedReader(args.bootstrap_servers, args.topic or "replies", decode=json.loads) as reader:
            rows = reader.read_to_committed_end()
    except (KafkaException, LookupError) as exc:
        raise FlinkAgentsReplayError(f"Kafka at {args.bootstrap_servers}: {exc}") from None
    seen = Counter(row["ticket_id"] for row in rows)
    for row in rows[-args.show:] if args.show else []:
        print(json.dumps(row, sort_keys=True))
    print(f"{len(rows)} committed replies for {len(seen)} tickets; answered twice: "
          f"{sum(1 for n in seen.values() if n > 1)}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    import json

    from flink_agents_replay.flink.config import SIGNING_KEY_ENV, default_capture_topic, default_uid
    from flink_agents_replay.replay.prices import price_table
    from flink_agents_replay.replay.report import diff_captures

    prices = price_table(args.price, args.prices)  # before Kafka: a bad price fails at once
    trace_viewer = _trace_viewer(args)  # so does a bad trace URL
    if not args.signing_key:
        raise ConfigError(f"the captures are signed: give --signing-key or set ${SIGNING_KEY_ENV}")
    uid = args.uid or default_uid(args.agent_id)
    production = args.production or default_capture_topic(uid)
    skipped: list[str] = []
    report = diff_captures(_kafka_settings(args).client, production, args.replay,
                           signing_key=args.signing_key.encode(), uid=uid, prices=prices,
                           skip_invalid=lambda error: skipped.append(str(error)))
    print(f"production capture {production} vs replay capture {args.replay}")
    if skipped:  # someone wrote into a capture topic: said, not fatal (the replay job dead-lettered such inputs)
        print(f"skipped {len(skipped)} capture record(s) that do not verify; the first: {skipped[0]}",
              file=sys.stderr)
    print(report.render_text(max_width=args.width, trace_viewer=trace_viewer))
    memory = _memory_diff(args, keys={run.key for run in report.runs}) if args.memory_namespace else None
    if memory is not None:
        print(memory.render_text())
    if args.json:
        as_json = report.to_json() if memory is None else {**report.to_json(), "memory": memory.to_json()}
        Path(args.json).write_text(json.dumps(as_json, indent=1))
        print(f"JSON report: {args.json}")
    if args.html:
        Path(args.html).write_text(report.render_html(trace_viewer=trace_viewer), encoding="utf-8")
        print(f"HTML report: {args.html}")
    differs = report.has_differences or (memory is not None and bool(memory.differing))
    return 1 if args.fail_on_diff and differs else 0


def _trace_viewer(args: argparse.Namespace):
    """The trace viewer ``diff`` links runs to (``--trace-url-template``, or Phoenix at ``--trace-viewer-url``), or
    ``None``."""
    from flink_agents_replay.replay.diff import TraceViewer

    if args.trace_url_template:
        return TraceViewer(args.trace_url_template)
    if args.trace_viewer_url:
        return TraceViewer.phoenix(args.trace_viewer_url)
    return None


def _memory_diff(args: argparse.Namespace, *, keys=()):
    """The long-term memory comparison of ``diff --memory-namespace`` and ``memory diff``."""
    from flink_agents_replay.longterm.fork_diff import memory_diff

    if args.as_of is None:
        raise ConfigError("give the savepoint's memory epoch (--as-of; the replay job prints it)")
    with _memory_store(args) as store:
        return memory_diff(store, args.memory_namespace, as_of=args.as_of, replay=args.replay, keys=keys)


@contextlib.contextmanager
def _memory_store(args: argparse.Namespace):
    """The Chroma store the command names (``--store``, or ``diff``'s ``--memory-store``); a store that does not
    answer is a usage error, not a traceback."""
    from flink_agents_replay.integrations.chroma import ChromaVectorStore

    if not args.memory_store:
        option = "--store" if args.command == "memory" else "--memory-store"
        raise ConfigError(f"give the memory store's URL: {option} http://127.0.0.1:8100 or $CHROMA_URL")
    with ChromaVectorStore(args.memory_store) as store:
        try:
            yield store
        except (ConnectionError, OSError, ValueError) as exc:
            raise ConfigError(f"the memory store at {args.memory_store} did not answer: {exc}") from exc


# -- journal dump / load (moving a journal to another Kafka cluster) -------------------------------------
def _journal(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from flink_agents_replay.storage.journal.transfer import dump_topic, load_topic

    kafka = _kafka_settings(args)
    try:
        if args.action == "dump":
            header = dump_topic(kafka, topic=args.topic, path=args.out)
            kept = sum(header.high[p] - header.low[p] for p in header.high)
            print(f"dumped topic {header.topic} (id {header.topic_id}, {header.partitions} partitions, offsets "
                  f"spanning {kept} records) to {args.out}")
            return 0
        result = load_topic(kafka, path=args.input, topic=args.topic, config_overrides=dict(args.config or []),
                            signing_keys=_signing_keys_from_environment())
    except KafkaException as exc:
        raise FlinkAgentsReplayError(f"Kafka at {args.bootstrap_servers}: {exc.args[0]}") from None
    print(f"loaded {result.records} records (and {result.fillers} filler records) into topic {result.topic} at "
          f"their original offsets; old topic id {result.old_topic_id}, new topic id {result.new_topic_id}")
    print("to restore a savepoint or checkpoint taken against the old topic, add to the job's agent config:")
    print(f"    accept_moved_journal_from={result.old_topic_id!r}")
    return 0


def _signing_keys_from_environment():
    """The job's signing key from the environment, for re-signing a journal loaded under a new name; else None."""

    from flink_agents_replay.flink.config import SIGNING_KEY_ENV
    from flink_agents_replay.storage.records.codec import SigningKeys

    key = os.environ.get(SIGNING_KEY_ENV)
    if key and len(key) < 16:
        raise ConfigError(f"${SIGNING_KEY_ENV} must be at least 16 characters")
    return SigningKeys(key.encode()) if key else None


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog="flink-agents-replay", description="Local services, the demo, journal tools, replays and their diffs.")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_commands in (_add_local_commands, _add_inspect_command, _add_demo_command, _add_tickets_command,
                         _add_diff_command, _add_memory_commands, _add_journal_commands, _add_waits_commands):
        add_commands(commands)
    return parser


def _add_local_commands(commands) -> None:
    """``local kafka|flink|model|chroma|jars``: the development services."""
    local = commands.add_parser("local", help="local services for development, tests and the demo")
    services = local.add_subparsers(dest="service", required=True)

    kafka = services.add_parser("kafka", help="a real single-node Kafka broker (KRaft) on 127.0.0.1")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    kafka.add_argument("--port", type=int, default=9092, help="client port (0: any free port; default 9092)")
    kafka.add_argument("--work-dir", type=Path, default=None,
                       help="data, log and PID directory (default: $FLINK_AGENTS_REPLAY_HOME/kafka)")
    kafka.set_defaults(handler=_kafka)

    flink = services.add_parser("flink", help="a standalone Flink session cluster on 127.0.0.1 (pyflink's bin/)")
    flink.add_argument("action", choices=["start", "stop", "status"])
    flink.add_argument("--rest-port", type=int, default=8081,
                       help="REST API and web UI port (0: any free port; default 8081)")
    flink.add_argument("--taskmanagers", type=_at_least_one, default=1,
                       help="TaskManagers to start, 4 slots each (default 1)")
    flink.add_argument("--work-dir", type=Path, default=None,
                       help="config, logs, PIDs, checkpoints and savepoints (default: $FLINK_AGENTS_REPLAY_HOME/flink)")
    flink.set_defaults(handler=_flink)

    model = services.add_parser("model", help="an OpenAI-compatible stub model and order-lookup service, "
                                "counting every request (offline demo and tests)")
    model.add_argument("action", choices=["start", "stop", "status"])
    model.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port; default 8000)")
    model.add_argument("--delay-ms", type=_non_negative, default=0,
                       help="wait before answering each chat or order request, a slow model (default 0)")
    model.add_argument("--work-dir", type=Path, default=None,
                       help="log and PID directory (default: $FLINK_AGENTS_REPLAY_HOME/model-server)")
    model.set_defaults(handler=_model)

    chroma = services.add_parser("chroma", help="a Chroma vector-store server for long-term memory (installed into "
                                 "an environment of its own on first use)")
    chroma.add_argument("action", choices=["start", "stop", "status"])
    chroma.add_argument("--port", type=int, default=8100, help="port on 127.0.0.1 (0: any free port; default 8100)")
    chroma.add_argument("--work-dir", type=Path, default=None,
                        help="data, log and PID directory (default: $FLINK_AGENTS_REPLAY_HOME/chroma/server)")
    chroma.set_defaults(handler=_chroma)

    phoenix = services.add_parser("phoenix", help="an Arize Phoenix trace viewer receiving OpenTelemetry spans "
                                  "(installed into an environment of its own on first use)")
    phoenix.add_argument("action", choices=["start", "stop", "status", "install"])
    phoenix.add_argument("--port", type=int, default=6006,
                         help="UI and OTLP/HTTP port on 127.0.0.1 (0: any free port; default 6006)")
    phoenix.add_argument("--work-dir", type=Path, default=None,
                         help="data, log and PID directory (default: $FLINK_AGENTS_REPLAY_HOME/phoenix/server)")
    phoenix.set_defaults(handler=_phoenix)

    jars = services.add_parser("jars", help="fetch the locked jars from Maven Central into the cache, checked by "
                                            "SHA-256 ($FLINK_AGENTS_REPLAY_MAVEN_URL: another repository)")
    jars.add_argument("action", choices=["fetch"])
    jars.add_argument("bundles", nargs="*", choices=[[], "kafka-broker", "flink-connectors",
                                                     "flink-kubernetes-operator-api"], default=[],
                      metavar="BUNDLE", help="kafka-broker, flink-connectors, flink-kubernetes-operator-api "
                                             "(default: the first two)")
    jars.set_defaults(handler=_jars)


def _add_inspect_command(commands) -> None:
    """``inspect``: what a journal topic holds."""
    inspect = commands.add_parser("inspect", help="what a journal topic holds (no signing key needed)")
    inspect.add_argument("--bootstrap-servers", required=True)
    inspect.add_argument("--topic", required=True, help="the journal topic")
    inspect.add_argument("--key", default=None, help="show this business key's records")
    inspect.add_argument("--key-type", default="STRING", choices=list(SUPPORTED_KEY_TYPES))
    inspect.add_argument("--all-partitions", action="store_true", help="also list partitions never written")
    _add_kafka_settings_option(inspect)
    inspect.set_defaults(handler=_inspect)


def _add_demo_command(commands) -> None:
    """``demo``: the TaskManager-kill demo."""
    demo = commands.add_parser("demo", help="the support-ticket agent on a local Flink cluster whose TaskManager is "
                               "killed mid-stream: prints calls made, repeated (0) and replies written once")
    demo.add_argument("--tickets", type=_at_least_one, default=300, help="tickets to feed (default 300)")
    demo.add_argument("--customers", type=_at_least_one, default=40, help="distinct customers (default 40)")
    demo.add_argument("--parallelism", type=_at_least_one, default=2, help="agent parallelism (default 2, max 4)")
    demo.add_argument("--model-delay-ms", type=_non_negative, default=40,
                      help="how long each model and order request takes (default 40)")
    demo.add_argument("--feed-per-second", type=_non_negative, default=25.0, help="tickets fed per second")
    demo.add_argument("--job-module", default="flink_agents_replay.jobs.agent_job",
                      help="module of the job to submit with `flink run -pym` (default the packaged main job)")
    demo.add_argument("--trace-viewer-url", default=None,
                      help="a running Phoenix (flink-agents-replay local phoenix start) to send the runs' traces to; "
                           "default: the demo starts one of its own and stops it at the end")
    demo.set_defaults(handler=_demo)


def _add_tickets_command(commands) -> None:
    """``tickets feed|replies``: sample traffic for the main job (flink_agents_replay.jobs.agent_job)."""
    tickets = commands.add_parser("tickets", help="feed sample tickets to the main job, read its replies")
    tickets.add_argument("action", choices=["feed", "replies"])
    tickets.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    tickets.add_argument("--topic", default=None, help="tickets topic to feed (default tickets) or replies topic "
                         "to read (default replies)")
    tickets.add_argument("--count", type=_at_least_one, default=100, help="tickets to feed (default 100)")
    tickets.add_argument("--start", type=int, default=0, help="number of the first ticket (default 0)")
    tickets.add_argument("--customers", type=_at_least_one, default=40, help="distinct customers (default 40)")
    tickets.add_argument("--show", type=int, default=3, help="replies to print (default: the last 3)")
    _add_kafka_settings_option(tickets)
    tickets.set_defaults(handler=_tickets)


def _add_diff_command(commands) -> None:
    """``diff``: a replay against production."""
    diff = commands.add_parser("diff", help="compare a replay's outputs with production's, per key and seq "
                               "(same / changed / new / missing / waiting), with each run's waits and decisions and "
                               "the calls the replay blocked")
    diff.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    diff.add_argument("--replay", required=True, help="the replay's capture topic (the replay job prints it)")
    diff.add_argument("--production", default=None,
                      help="production's capture topic (default: the agent's, flink-agents-replay.<agent id>.capture)")
    diff.add_argument("--agent-id", default="support-triage", help="the agent's name (default support-triage)")
    diff.add_argument("--uid", default=None, help="the operator uid, if the job set one (default from --agent-id)")
    diff.add_argument("--signing-key", default=os.environ.get("FLINK_AGENTS_REPLAY_SIGNING_KEY"),
                      help="the signing key of both jobs (default $FLINK_AGENTS_REPLAY_SIGNING_KEY)")
    diff.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    diff.add_argument("--html", default=None, metavar="FILE", help="also write the report as one HTML page")
    diff.add_argument("--width", type=_at_least_one, default=110, help="terminal table width (default 110)")
    diff.add_argument("--fail-on-diff", action="store_true",
                      help="exit 1 when any run is changed, new or missing, or still waiting where production "
                           "was not waiting at the same question, or memory differs (for CI)")
    diff.add_argument("--price", action="append", default=[], metavar="MODEL=PROMPT_PER_1M/COMPLETION_PER_1M",
                      help="a model's price in USD per 1M prompt and per 1M completion tokens, for the cost in the "
                           "model usage table (repeatable; MODEL '*' prices every other model), e.g. "
                           "--price gpt-4o-mini=0.15/0.60 --price '*=1/2'; overrides --prices")
    diff.add_argument("--prices", default=None, metavar="FILE",
                      help='a JSON price table: {"MODEL": {"prompt_per_1m": 0.15, "completion_per_1m": 0.6}, ...} '
                           "(without prices, costs are n/a)")
    viewer = diff.add_mutually_exclusive_group()
    viewer.add_argument("--trace-url-template", default=None, metavar="URL",
                        help="link each run that differs or failed to production's and the replay's trace: a trace "
                             "viewer's URL with {trace_id} for the trace id, e.g. "
                             "'http://jaeger:16686/trace/{trace_id}' (http or https)")
    viewer.add_argument("--trace-viewer-url", default=None, metavar="URL",
                        help="the same for Arize Phoenix at URL (e.g. http://127.0.0.1:6006): its "
                             "/redirects/traces/{trace_id} page")
    _add_memory_diff_options(diff, required=False)
    _add_kafka_settings_option(diff)
    diff.set_defaults(handler=_diff)


def _add_memory_commands(commands) -> None:
    """``memory diff|clean``: a replay's long-term memory overlay, against production's, and its removal."""
    memory = commands.add_parser("memory", help="a replay's long-term memory: compare it with production's "
                                 "changes after the savepoint, or delete it")
    actions = memory.add_subparsers(dest="action", required=True)
    diff = actions.add_parser("diff", help="per key: the memories the replay added, updated or deleted, next to "
                              "what production did after the savepoint")
    _add_memory_diff_options(diff, required=True)
    diff.add_argument("--json", default=None, metavar="FILE", help="also write the comparison as JSON")
    clean = actions.add_parser("clean", help="delete every overlay namespace the replay wrote; production's "
                               "memory is not touched")
    compact = actions.add_parser("compact", help="delete versions and tombstones no retained savepoint needs")
    compact.add_argument("--namespace", dest="memory_namespace", required=True, metavar="NS",
                         help="production's memory namespace")
    compact.add_argument("--oldest-retained", type=_epoch_or_time, required=True, metavar="EPOCH|TIME",
                         help="the oldest savepoint a replay may still start from: its memory epoch (its trigger "
                              "time in epoch ms; its checkpoint id if taken before 0.5), or a time at or before "
                              "it, ISO 8601 (2026-11-01T08:00:00Z)")
    for command in (clean, compact):
        command.add_argument("--store", dest="memory_store", default=os.environ.get("CHROMA_URL"), metavar="URL",
                             help="the Chroma server (default $CHROMA_URL)")
    compact.set_defaults(handler=_memory)
    for command in (diff, clean):
        command.add_argument("--replay", required=True, metavar="NAME",
                             help="the replay's name: its capture topic (the replay job prints it)")
        command.set_defaults(handler=_memory)


def _add_memory_diff_options(command, *, required: bool) -> None:
    """Where the long-term memory is and from which checkpoint on to compare it (``diff`` and ``memory diff``)."""
    prefix = "" if required else "memory-"
    command.add_argument(f"--{prefix}store", dest="memory_store", default=os.environ.get("CHROMA_URL"),
                         metavar="URL", help="the Chroma server of the agent's LongTermMemory (default $CHROMA_URL)")
    command.add_argument(f"--{prefix}namespace", dest="memory_namespace", required=required, metavar="NS",
                         help="production's memory namespace (a LongTermMemory's default: <agent>/<resource>)"
                              + ("" if required else "; compares long-term memory too"))
    command.add_argument("--as-of", type=int, required=required, default=None, metavar="EPOCH",
                         help="the savepoint's memory epoch: its trigger time in epoch ms, its checkpoint id if "
                              "taken before 0.5 (the replay job prints it)")


def _epoch_or_time(text: str) -> int:
    """A memory epoch (an integer), or an ISO 8601 time as its epoch (milliseconds; UTC without a zone)."""
    from datetime import datetime, timezone

    if text.strip().lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an epoch nor an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def _memory(args: argparse.Namespace) -> int:
    import json

    from flink_agents_replay.longterm.fork_diff import clean_replay
    from flink_agents_replay.longterm.versions import compact

    if args.action == "diff":
        report = _memory_diff(args)
        print(report.render_text(), end="")
        if args.json:
            Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
            print(f"JSON report: {args.json}")
        return 0
    with _memory_store(args) as store:
        if args.action == "compact":
            removed = compact(store, args.memory_namespace, oldest_retained=args.oldest_retained)
            print(f"deleted {removed} document(s) of {args.memory_namespace} no savepoint from epoch "
                  f"{args.oldest_retained} on needs")
            return 0
        dropped = clean_replay(store, args.replay)
    print(f"deleted {len(dropped)} overlay namespace(s) of replay {args.replay}: " + (", ".join(dropped) or "none"))
    return 0


def _add_journal_commands(commands) -> None:
    """``journal dump|load``: move a journal (or capture) topic to another Kafka cluster, offsets kept."""
    journal = commands.add_parser("journal", help="dump a journal (or capture) topic to a file and load it into "
                                  "another Kafka cluster, every record at its offset")
    actions = journal.add_subparsers(dest="action", required=True)
    dump = actions.add_parser("dump", help="write every record of a topic to a file (gzip JSON lines)")
    dump.add_argument("--out", required=True, metavar="FILE", help="the dump file to write")
    load = actions.add_parser("load", help="create the topic on the target cluster and write the dump into it; "
                              "prints the setting that lets a restore accept the new topic id")
    load.add_argument("--in", dest="input", required=True, metavar="FILE", help="a dump written by 'journal dump'")
    load.add_argument("--config", type=_setting, action="append", metavar="NAME=VALUE",
                      help="a topic setting overriding the dumped one (e.g. retention.ms=-1); repeatable")
    for command, topic_help in ((dump, "the topic to dump"),
                                (load, "the topic to create (default: the dumped topic's name)")):
        command.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
        command.add_argument("--topic", required=command is dump, default=None, help=topic_help)
        _add_kafka_settings_option(command)
        command.set_defaults(handler=_journal)


def _add_waits_commands(commands) -> None:
    """``waits list|decide``: the runs waiting for a decision, and deciding one."""
    waits = commands.add_parser("waits", help="runs waiting for a decision (ctx.wait_for, tools that need approval): "
                                "list them from the job's waits topic, decide one on its signals topic")
    actions = waits.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the pending waits (opened, neither resumed nor closed), oldest first")
    listing.add_argument("--waits-topic", required=True, metavar="TOPIC", help="the job's --waits-topic")
    listing.add_argument("--key", default=None, help="only the waits of this key")
    listing.add_argument("--all", dest="everything", action="store_true",
                         help="every wait, with the kind of its last event (opened, resumed, closed...)")
    listing.add_argument("--json", action="store_true", help="print the waits as one JSON array")
    decide = actions.add_parser("decide", help="send a decision for a wait to the job's signals topic")
    decide.add_argument("wait_id", metavar="WAIT_ID", help="the wait's id (waits list shows it)")
    verdict = decide.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", dest="approved", action="store_true", default=None, help="approve the wait")
    verdict.add_argument("--deny", dest="approved", action="store_false", help="deny the wait")
    decide.add_argument("--reason", default=None, help="why, in words (a denied tool call's model is shown it)")
    decide.add_argument("--value", default=None, metavar="JSON",
                        help="a JSON value for the agent, e.g. '{\"amount\": 80}'")
    decide.add_argument("--by", default=None, help="who decides (free text)")
    decide.add_argument("--signals-topic", required=True, metavar="TOPIC", help="the job's --signals-topic")
    where = decide.add_mutually_exclusive_group(required=True)
    where.add_argument("--waits-topic", default=None, metavar="TOPIC",
                       help="the job's --waits-topic: the wait's key is looked up there")
    where.add_argument("--key", default=None, help="the key of the run that waits (no lookup)")
    for command in (listing, decide):
        command.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                             metavar="HOST:PORT", help="the job's Kafka (default $KAFKA_BOOTSTRAP_SERVERS)")
        command.add_argument("--timeout-s", type=_non_negative, default=15.0,
                             help="how long to wait for Kafka (default 15)")
        _add_kafka_settings_option(command)
        command.set_defaults(handler=_waits)


def _waits(args: argparse.Namespace) -> int:
    import json

    from flink_agents_replay.cli import waits

    kafka = _kafka_settings(args)
    if args.action == "list":
        folded = waits.fold_wait_events(waits.read_wait_events(kafka, args.waits_topic, timeout_s=args.timeout_s))
        chosen = waits.selected(folded, key=args.key, everything=args.everything)
        if folded.skipped:
            print(f"skipped {folded.skipped} record(s) of {args.waits_topic} that are not wait events this version "
                  "reads", file=sys.stderr)
        if args.json:
            print(json.dumps([waits.wait_json(wait) for wait in chosen], sort_keys=True))
            return 0
        if chosen:
            print(waits.format_waits(chosen, everything=args.everything))
        what = ("wait" if args.everything else "pending wait") + ("" if len(chosen) == 1 else "s")
        print(f"{len(chosen)} {what} ({len(folded.waits)} in all, from {folded.events} events of {args.waits_topic})")
        return 0
    value = waits.parse_value(args.value) if args.value is not None else None  # before Kafka: fails at once
    if args.key is not None:
        key = args.key
    else:
        events = waits.read_wait_events(kafka, args.waits_topic, timeout_s=args.timeout_s)
        key = waits.key_of_wait(waits.fold_wait_events(events), args.wait_id, args.waits_topic)
    record = waits.decision_record(key, args.wait_id, approved=args.approved, reason=args.reason, value=value,
                                   with_value=args.value is not None, by=args.by)
    partition, offset = waits.send_decision(kafka, args.signals_topic, record, timeout_s=args.timeout_s)
    print(f"{'approved' if args.approved else 'denied'} wait {args.wait_id} (key {key!r}): signal "
          f"{record['signal_id']} written to {args.signals_topic} partition {partition} offset {offset}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (LocalServiceError, FlinkAgentsReplayError) as exc:
        print(f"flink-agents-replay: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.stderr.close()
        return 0

