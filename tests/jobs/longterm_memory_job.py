"""Test job for ``flink run -py``: Kafka inputs -> an agent with long-term memory -> exactly-once Kafka outputs.

Each input ``{"key": ..., "n": ...}`` is one ticket. The agent's action searches the key's memories
(``LongTermMemory`` on a Chroma server, embeddings from the local model service), remembers the ticket, then
calls a slow ``file`` tool (counted in an :class:`~flink_agents_replay.testing.counter.InvocationCounter` file:
``call:file:<key>|<n>|`` when it begins, ``done:...`` when it returns), and answers with what the search
found. A TaskManager killed while ``file`` calls are under way kills actions whose add already reached the
store. Used by ``tests/integration/test_longterm_sigkill.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from pyflink.common import Types

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings
from flink_agents_replay.testing.counter import InvocationCounter
from flink_agents_replay.testing.jobs import canonical_output, exactly_once_string_sink, keyed_json_inputs


def ticket_text(key: str, n: int) -> str:
    """The ticket an input stands for (texts of one key share words, so its searches find them)."""
    return f"{key} ticket {n}: parcel {n} of {key} arrived late"


class MemoryAgent(Agent):
    """Search the key's memory, remember the ticket, file it (slow), answer with what the search found."""

    @action(InputEvent)
    def answer(event, ctx):
        key, n = event.input["key"], event.input["n"]
        text = ticket_text(key, n)
        past = ctx.call("memory", "search", f"what happened to {key} before ticket {n}", limit=50)["results"]
        ctx.call("memory", "add", text, metadata={"n": n})
        ctx.call("file", f"{key}|{n}|")
        ctx.send_event(OutputEvent(output={"n": n, "past": sorted(hit["memory"] for hit in past)}))


def slow_filing(counter: InvocationCounter, delay_s: float):
    def file(ticket: str) -> str:
        counter.increment(f"call:file:{ticket}")
        time.sleep(delay_s)  # a slow service: the kill lands while calls are under way
        counter.increment(f"done:file:{ticket}")
        return "filed"
    return file


def memory_agent(*, chroma_url: str, model_url: str, counter: InvocationCounter, name: str,
                 delay_s: float = 0.0) -> MemoryAgent:
    memory = LongTermMemory(ChromaVectorStore(chroma_url),
                            OpenAIEmbeddings("local-embed", base_url=model_url, api_key="unused"))
    return MemoryAgent(name=name, resources={"memory": memory, "file": Tool(slow_filing(counter, delay_s))})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option in ("bootstrap-servers", "input-topic", "output-topic", "journal-topic", "counter-path",
                   "signing-key", "chroma-url", "model-url", "agent-name"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--call-delay-s", type=float, default=0.3)
    parser.add_argument("--checkpoint-interval-ms", type=int, default=2000)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = create_environment(parallelism=1, checkpoint_interval_ms=args.checkpoint_interval_ms, restart_attempts=3,
                             restart_delay_ms=500, jars=[kafka_connector_jar()])
    keyed = keyed_json_inputs(env, args.bootstrap_servers, args.input_topic)
    agent = memory_agent(chroma_url=args.chroma_url, model_url=args.model_url, name=args.agent_name,
                         counter=InvocationCounter(args.counter_path), delay_s=args.call_delay_s)
    config = {"kafka": {"bootstrap.servers": args.bootstrap_servers}, "journal_topic": args.journal_topic,
              "signing_key": args.signing_key, "max_concurrent_runs": 8}
    sink = exactly_once_string_sink(args.bootstrap_servers, args.output_topic, f"longterm-{uuid.uuid4().hex[:8]}")
    (connect_to_agent(keyed, agent, config)
     .map(lambda output: json.dumps(canonical_output(output)), output_type=Types.STRING())
     .uid("longterm/serialize").sink_to(sink).uid("longterm/sink"))
    env.execute(f"long-term memory job {args.agent_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
