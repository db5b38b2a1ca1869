"""The packaged jobs' trace flags (``--trace``, ``--otlp-endpoint``, ``--trace-content``), shared by the main job and
the replay job: they turn ``AgentConfig.tracing`` on. A replay's runs are traced under ``<service>-replay``."""

from __future__ import annotations

import argparse

__all__ = ["add_trace_arguments", "tracing"]


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", action="store_true",
                        help="send OpenTelemetry traces of the runs over OTLP/HTTP, configured by the standard "
                             "OTEL_EXPORTER_OTLP_* and OTEL_SERVICE_NAME variables where the job runs")
    parser.add_argument("--otlp-endpoint", default=None,
                        help="trace to this OTLP/HTTP endpoint (http://host:4318; implies --trace)")
    parser.add_argument("--trace-content", action="store_true",
                        help="put prompts, replies, tool arguments and results into the spans (off by default; "
                             "implies --trace)")


def tracing(args: argparse.Namespace) -> dict | None:
    """The agent's tracing settings from the arguments (``None``: off)."""
    if not (args.trace or args.otlp_endpoint or args.trace_content):  # each asks for traces
        return None
    return {"endpoint": args.otlp_endpoint, "capture_content": True if args.trace_content else None}
