"""``flink-agents-replay``: the command line.

    flink-agents-replay local kafka start [--port N] [--work-dir DIR]
    flink-agents-replay local kafka status|stop [--work-dir DIR]
    flink-agents-replay local jars fetch [kafka-broker|flink-connectors]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flink_agents_replay.local.errors import LocalServiceError

__all__ = ["main"]


def _kafka(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.kafka_broker import LocalKafkaBroker

    broker = LocalKafkaBroker(args.work_dir, port=args.port)
    if args.action == "start":
        already = broker.status().running
        status = broker.start()
        print(("already " if already else "") + status.describe())
        print(f"export KAFKA_BOOTSTRAP_SERVERS={status.bootstrap_servers}")
    elif args.action == "stop":
        print("stopped" if broker.stop() else "was not running")
    else:
        status = broker.status()
        print(status.describe())
        return 0 if status.running else 3  # like `systemctl status`: 3 = not running
    return 0


def _jars(args: argparse.Namespace) -> int:
    from flink_agents_replay.local.jars import FLINK_CONNECTORS, KAFKA_BROKER, fetch_jars

    for bundle in args.bundles or [KAFKA_BROKER, FLINK_CONNECTORS]:
        print(f"{bundle}: {fetch_jars(bundle)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(prog="flink-agents-replay", description=__doc__.split("\n")[0].strip("`: "))
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="local services for development, tests and the demo")
    services = local.add_subparsers(dest="service", required=True)

    kafka = services.add_parser("kafka", help="a real single-node Kafka broker (KRaft) on 127.0.0.1")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    kafka.add_argument("--port", type=int, default=9092, help="client port (0: any free port; default 9092)")
    kafka.add_argument("--work-dir", type=Path, default=None,
                       help="data, log and PID directory (default: $FLINK_AGENTS_REPLAY_HOME/kafka)")
    kafka.set_defaults(handler=_kafka)

    jars = services.add_parser("jars", help="fetch jars from Maven Central into the cache")
    jars.add_argument("action", choices=["fetch"])
    jars.add_argument("bundles", nargs="*", choices=[[], "kafka-broker", "flink-connectors"], default=[],
                      metavar="BUNDLE", help="kafka-broker and/or flink-connectors (default: both)")
    jars.set_defaults(handler=_jars)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except LocalServiceError as exc:
        print(f"flink-agents-replay: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
