"""Long-term memory outlives a job: two job lineages share it, and a replay of either lineage's savepoint reads it
as of that savepoint's moment. Real Kafka, Flink MiniCluster jobs, the project's Chroma server.

Lineage A (a fresh job) takes a note per customer, and savepoint A is taken; A is cancelled. Lineage B is a new
deployment started without a savepoint (its checkpoints are numbered from 1 again) on the same memory namespace:
it takes a second note per customer, and savepoint B is taken. After each savepoint the lineage answers one
probe per customer: the notes it sees in memory (``get_all``) and finds (``search``).

A replay of each savepoint answers the probes again and must answer as production did:

* replay A runs after B wrote its notes, so it must not see them (they were written after savepoint A);
* replay B must see A's notes (written before savepoint B, by an older lineage).

Lineage A takes ten savepoints before its notes, so that its checkpoint ids are ahead of lineage B's: with
epochs counted in checkpoint ids, B's notes would count as before savepoint A and A's notes as after savepoint
B, and both replays would differ from production.
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass

import cloudpickle
import pytest
from pyflink.common import Types

from flink_agents_replay import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.flink.config import default_uid
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.integrations.vector_store import Where
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings
from flink_agents_replay.replay.job import captured_inputs, prepare_replay, replay_config
from flink_agents_replay.replay.report import diff_captures
from flink_agents_replay.testing.committed import CommittedReader
from flink_agents_replay.testing.jobs import (
    exactly_once_string_sink,
    keyed_json_inputs,
    produce_json,
    running_job,
    trigger_savepoint,
    wait_until,
)

pytestmark = pytest.mark.integration

SIGNING_KEY = "longterm-lineages-signing-key-0123456789"
MAX_PARALLELISM = 8
CUSTOMERS = [f"customer-{k}" for k in range(3)]
AGENT_NAME = "lineage-notes"
NAMESPACE = f"{AGENT_NAME}/memory"


class Notes(Agent):
    """``note``: remember the ticket's text; ``probe``: answer with what memory holds and what a search finds."""

    @action(InputEvent)
    def handle(event, ctx):
        ticket = event.input
        if ticket["op"] == "note":
            ctx.call("memory", "add", ticket["text"])
            ctx.send_event(OutputEvent(output={"n": ticket["n"], "noted": ticket["text"]}))
            return
        seen = sorted(m["memory"] for m in ctx.call("memory", "get_all")["results"])
        found = sorted(m["memory"] for m in ctx.call("memory", "search", "parcel late", limit=5)["results"])
        ctx.send_event(OutputEvent(output={"n": ticket["n"], "seen": seen, "found": found}))


def _tickets(lineage: str, op: str, n: int) -> list[dict]:
    return [{"key": c, "n": n, "op": op, "text": f"{c} lineage {lineage} note: parcel late"} for c in CUSTOMERS]


def _agent(chroma_url: str, model_url: str) -> Notes:
    memory = LongTermMemory(ChromaVectorStore(chroma_url), OpenAIEmbeddings("local-embed", base_url=model_url,
                                                                            api_key="unused"))
    return Notes(name=AGENT_NAME, resources={"memory": memory})



def _answer(output) -> str:
    return json.dumps({"key": output.key, **output.output}, sort_keys=True)


@dataclass
class Lineage:
    name: str
    config: dict
    savepoint: str
    answers: list[dict]

    def probes(self) -> dict[str, dict]:
        return {a["key"]: a for a in self.answers if a["n"] == 1}


def _run_lineage(name: str, bootstrap: str, chroma_url: str, model_url: str, directory, *,
                 savepoints_first: int) -> Lineage:
    """A fresh production job: a warm-up, (``savepoints_first`` savepoints,) notes, savepoint, probes; cancelled."""
    suffix = f"{name}-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic = f"lineage-in-{suffix}", f"lineage-out-{suffix}"
    ensure_topics(bootstrap, [input_topic, output_topic], 1)
    config = {"kafka": {"bootstrap.servers": bootstrap}, "signing_key": SIGNING_KEY,
              "journal_topic": f"lineage-journal-{suffix}", "capture": True,
              "capture_topic": f"lineage-capture-{suffix}", "output_topics": [output_topic],
              "max_parallelism": MAX_PARALLELISM}
    env = create_environment(parallelism=2, checkpoint_interval_ms=1500, jars=[kafka_connector_jar()])
    outputs = connect_to_agent(keyed_json_inputs(env, bootstrap, input_topic), _agent(chroma_url, model_url), config)
    outputs.map(_answer, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(bootstrap, output_topic, f"lineage-{suffix}")).uid("outputs")
    warm_up = [{"key": "warm-up", "n": -1, "op": "probe"}]  # answered: every task runs (savepoints can start)
    notes, probes = _tickets(name, "note", 0), _tickets(name, "probe", 1)
    with CommittedReader(bootstrap, output_topic, json.loads) as reader, \
            running_job(env, f"lineage {name}") as client:
        produce_json(bootstrap, input_topic, warm_up)
        wait_until(client, lambda: len(reader.poll(0.1)) >= 1, f"lineage {name} to answer")
        for _ in range(savepoints_first):
            trigger_savepoint(client, directory)
        produce_json(bootstrap, input_topic, notes)
        wait_until(client, lambda: len(reader.poll(0.1)) >= len(warm_up + notes), f"lineage {name}'s notes")
        savepoint = trigger_savepoint(client, directory)
        produce_json(bootstrap, input_topic, probes)
        wait_until(client, lambda: len(reader.poll(0.1)) >= len(warm_up + notes + probes), f"lineage {name}'s probes")
        return Lineage(name, config, savepoint, list(reader.rows))


def _replay(lineage: Lineage, bootstrap: str, chroma_url: str, model_url: str):
    """Replay the lineage's probes from its savepoint; returns the comparison with production and the settings."""
    uid = default_uid(AGENT_NAME)
    kafka = {"bootstrap.servers": bootstrap}
    settings = prepare_replay(kafka, lineage.config["capture_topic"], lineage.savepoint, uid=uid, key_type="STRING",
                              max_parallelism=MAX_PARALLELISM, policies={})
    capture_topic = f"{lineage.config['capture_topic']}.replay"
    output_topic = f"lineage-replay-out-{uuid.uuid4().hex[:8]}"
    ensure_topics(bootstrap, [output_topic], 1)
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()], config={
        "execution.savepoint.path": lineage.savepoint, "execution.savepoint.ignore-unclaimed-state": "true"})
    inputs = captured_inputs(env, kafka, settings, SIGNING_KEY.encode(), uid=uid, key_type="STRING")
    config = replay_config(lineage.config, settings, journal_topic=f"{lineage.config['journal_topic']}.replay",
                           capture_topic=capture_topic, output_topics=[output_topic])
    outputs = connect_to_agent(inputs, _agent(chroma_url, model_url), config)
    outputs.map(_answer, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(bootstrap, output_topic, f"lineage-replay-{lineage.name}")).uid("replay-out")
    env.execute(f"replay of lineage {lineage.name}")
    return diff_captures(kafka, lineage.config["capture_topic"], capture_topic, signing_key=SIGNING_KEY.encode(),
                         uid=uid), settings


@pytest.fixture(scope="module")
def lineages(kafka_bootstrap, chroma_server, tmp_path_factory):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from flink_agents_replay.local.model_server import StubModelServer

    model = StubModelServer().start()
    chroma_url = chroma_server.status().url
    with ChromaVectorStore(chroma_url) as store:
        store.drop(NAMESPACE)
    directory = tmp_path_factory.mktemp("lineage-savepoints")
    try:
        first = _run_lineage("A", kafka_bootstrap, chroma_url, model.base_url, directory, savepoints_first=10)
        second = _run_lineage("B", kafka_bootstrap, chroma_url, model.base_url, directory, savepoints_first=0)
        replays = {lineage.name: _replay(lineage, kafka_bootstrap, chroma_url, model.base_url)
                   for lineage in (first, second)}
        yield {"A": first, "B": second, "replays": replays, "chroma_url": chroma_url}
    finally:
        model.stop()


def _notes(lineage: str, customer: str) -> str:
    return f"{customer} lineage {lineage} note: parcel late"


def test_production_probes_saw_the_notes_of_every_lineage_so_far(lineages):
    for customer in CUSTOMERS:
        assert lineages["A"].probes()[customer]["seen"] == [_notes("A", customer)]
        assert lineages["B"].probes()[customer]["seen"] == [_notes("A", customer), _notes("B", customer)]


def test_a_replay_of_the_old_lineage_does_not_see_what_the_new_lineage_wrote_later(lineages):
    report, settings = lineages["replays"]["A"]
    assert report.summary["compared"] == len(CUSTOMERS)
    assert report.differing == [], report.render_text()
    with ChromaVectorStore(lineages["chroma_url"]) as store:
        written_by_b = [d for d in store.get(NAMESPACE, Where()) if " lineage B " in d.text]
    assert len(written_by_b) == len(CUSTOMERS)
    assert all(int(d.metadata["valid_from"]) > settings.memory_as_of for d in written_by_b)  # after savepoint A


def test_a_replay_of_the_new_lineage_sees_what_the_old_lineage_wrote_before_it(lineages):
    report, settings = lineages["replays"]["B"]
    assert report.summary["compared"] == len(CUSTOMERS)
    assert report.differing == [], report.render_text()
    replayed = {run.key: run.replay[0] for run in report.runs}
    assert all(replayed[c]["seen"] == [_notes("A", c), _notes("B", c)] for c in CUSTOMERS)
