"""A replay from a savepoint forks long-term memory: real Kafka, Flink MiniCluster jobs, the project's Chroma server.

Production (capture on) takes notes for 4 customers (3 each), commits them, and a savepoint is taken. After it
production goes on: per customer it revises the first note (an update), takes one more note (an add) and
forgets the second note (a delete). Each answer says what the action saw in memory before changing it.

Two replays from the savepoint process production's post-savepoint inputs again, memory calls live:

* the same agent: every answer must equal production's. A replay reading production's memory *now* would see
  the revision, the note and the deletion made after the savepoint, and answer differently; so equal answers
  prove the as-of view (a post-savepoint update and delete included) and that the replay's reads merge its own
  overlay writes. Its memory diff is "same" for every customer: the same changes to the same memory ids.
* a changed agent (it revises notes with other words): its later answers see its own rewording (the overlay),
  and its memory diff shows, per customer, the replay's update against production's.

Production's namespace is dumped before and after both replays and must be identical; each replay's writes
are in its overlay only, and ``flink-agents-replay memory clean`` deletes them.
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass

import cloudpickle
import pytest
from pyflink.common import Types

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.flink.config import default_uid
from flink_agents_replay.flink.env import create_environment
from flink_agents_replay.flink.pipeline import connect_to_agent
from flink_agents_replay.integrations.kafka.admin import ensure_topics
from flink_agents_replay.integrations.vector_store import Where
from flink_agents_replay.local.jars import kafka_connector_jar
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings, overlay_namespace
from flink_agents_replay.longterm.fork_diff import memory_diff
from flink_agents_replay.replay.diff import compare
from flink_agents_replay.replay.job import captured_inputs, prepare_replay, replay_config
from flink_agents_replay.storage.capture.reader import CaptureDecoder, read_capture
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedRun
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

SIGNING_KEY = "longterm-replay-signing-key-0123456789"
MAX_PARALLELISM = 16
CUSTOMERS = [f"customer-{k}" for k in range(4)]
AGENT_NAME = "memory-triage"


class NoteTaker(Agent):
    """``note``: search, then remember; ``revise``: update the first note; ``forget``: delete the second.
    Every answer lists the memories the action saw first (``get_all``) and what the search found."""

    @action(InputEvent)
    def handle(event, ctx):
        ticket = event.input
        seen = ctx.call("memory", "get_all")["results"]
        answer = {"n": ticket["n"], "op": ticket["op"], "seen": [m["memory"] for m in seen]}
        if ticket["op"] == "note":
            found = ctx.call("memory", "search", ticket["text"], limit=2)["results"]
            answer["found"] = sorted(m["memory"] for m in found)
            ctx.call("memory", "add", ticket["text"], metadata={"n": ticket["n"]})
        elif ticket["op"] == "revise":
            wording = ctx.call("wording")
            ctx.call("memory", "update", seen[0]["id"], f"{wording}: {seen[0]['memory']}")
        else:
            ctx.call("memory", "delete", seen[1]["id"])
        ctx.send_event(OutputEvent(output=answer))


def tickets(ops: list[str], first: int) -> list[dict]:
    return [{"key": c, "n": first + i, "op": op, "text": f"{c} note {first + i}: parcel {first + i} late"}
            for i, op in enumerate(ops) for c in CUSTOMERS]


BEFORE = tickets(["note", "note", "note"], 0)
AFTER = tickets(["revise", "note", "forget"], 3)


def agent(chroma_url: str, model_url: str, *, changed: bool) -> NoteTaker:
    memory = LongTermMemory(ChromaVectorStore(chroma_url), OpenAIEmbeddings("local-embed", base_url=model_url,
                                                                            api_key="unused"))
    wording = "reworded" if changed else "revised"
    return NoteTaker(name=AGENT_NAME, resources={"memory": memory,
                                                 "wording": Tool(lambda: wording, side_effects="none")})



def _answers(output) -> str:
    return json.dumps({"key": output.key, **output.output}, sort_keys=True)


@dataclass
class Production:
    bootstrap: str
    chroma_url: str
    model_url: str
    config: dict
    savepoint: str
    answers: list[dict]

    @property
    def uid(self) -> str:
        return default_uid(AGENT_NAME)

    def captured(self, topic: str) -> list:
        decoder = CaptureDecoder(SIGNING_KEY.encode(), self.uid)
        return list(read_capture({"bootstrap.servers": self.bootstrap}, topic, MAX_PARALLELISM, decoder))


def dump(chroma_url: str, namespace: str) -> list:
    with ChromaVectorStore(chroma_url) as store:
        return store.get(namespace, Where())


NAMESPACE = f"{AGENT_NAME}/memory"


@pytest.fixture(scope="module")
def production(kafka_bootstrap, chroma_server, tmp_path_factory):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    from flink_agents_replay.local.model_server import StubModelServer

    model = StubModelServer().start()
    chroma_url, suffix = chroma_server.status().url, uuid.uuid4().hex[:8]
    with ChromaVectorStore(chroma_url) as store:
        store.drop(NAMESPACE)
    input_topic, output_topic = f"memory-in-{suffix}", f"memory-out-{suffix}"
    ensure_topics(kafka_bootstrap, [input_topic, output_topic], 1)
    config = {"kafka": {"bootstrap.servers": kafka_bootstrap}, "signing_key": SIGNING_KEY,
              "journal_topic": f"memory-journal-{suffix}", "capture": True, "capture_topic": f"memory-capture-{suffix}",
              "output_topics": [output_topic], "max_parallelism": MAX_PARALLELISM}
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()])
    outputs = connect_to_agent(keyed_json_inputs(env, kafka_bootstrap, input_topic), agent(chroma_url, model.base_url,
                                                                                 changed=False), config)
    outputs.map(_answers, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(kafka_bootstrap, output_topic, f"memory-prod-{suffix}")).uid("outputs")
    produce_json(kafka_bootstrap, input_topic, BEFORE)
    with CommittedReader(kafka_bootstrap, output_topic, json.loads) as reader, \
            running_job(env, "production with memory") as client:
        wait_until(client, lambda: len(reader.poll(0.1)) >= len(BEFORE), "the notes before the savepoint")
        savepoint = trigger_savepoint(client, tmp_path_factory.mktemp("savepoints"))
        produce_json(kafka_bootstrap, input_topic, AFTER)
        wait_until(client, lambda: len(reader.poll(0.1)) >= len(BEFORE + AFTER), "every answer", 180)
        answers = list(reader.rows)
    yield Production(kafka_bootstrap, chroma_url, model.base_url, config, savepoint, answers)
    model.stop()


def _replay(production: Production, name: str, *, changed: bool):
    """Replay the post-savepoint inputs; returns (the report, its capture topic, the memory epoch it read as of)."""
    settings = prepare_replay({"bootstrap.servers": production.bootstrap}, production.config["capture_topic"],
                              production.savepoint, uid=production.uid, key_type="STRING",
                              max_parallelism=MAX_PARALLELISM, policies={})
    suffix = f"{name}-{uuid.uuid4().hex[:6]}"
    capture_topic = f"{production.config['capture_topic']}.replay-{suffix}"
    output_topic = f"memory-replay-out-{suffix}"
    ensure_topics(production.bootstrap, [output_topic], 1)
    env = create_environment(parallelism=2, checkpoint_interval_ms=400, jars=[kafka_connector_jar()], config={
        "execution.savepoint.path": production.savepoint, "execution.savepoint.ignore-unclaimed-state": "true"})
    inputs = captured_inputs(env, {"bootstrap.servers": production.bootstrap}, settings, SIGNING_KEY.encode(),
                             uid=production.uid, key_type="STRING")
    config = replay_config(production.config, settings, journal_topic=f"{production.config['journal_topic']}.{suffix}",
                           capture_topic=capture_topic, output_topics=[output_topic])
    outputs = connect_to_agent(inputs, agent(production.chroma_url, production.model_url, changed=changed), config)
    outputs.map(_answers, output_type=Types.STRING()).sink_to(
        exactly_once_string_sink(production.bootstrap, output_topic, f"memory-replay-{suffix}")).uid("replay-out")
    env.execute(f"memory replay {name}")
    replayed = production.captured(capture_topic)
    runs = [r for r in production.captured(production.config["capture_topic"]) if isinstance(r, CapturedRun)]
    report = compare(runs, [r for r in replayed if isinstance(r, CapturedRun)],
                     [r for r in replayed if isinstance(r, CapturedInput)])
    return report, capture_topic, settings.memory_as_of


@pytest.fixture(scope="module")
def replays(production):
    before = dump(production.chroma_url, NAMESPACE)
    unchanged = _replay(production, "same", changed=False)
    changed = _replay(production, "changed", changed=True)
    return {"before": before, "after": dump(production.chroma_url, NAMESPACE), "same": unchanged,
            "changed": changed}


def test_production_changed_memory_after_the_savepoint(production, replays):
    by_op = {(a["key"], a["n"]): a for a in production.answers}
    for customer in CUSTOMERS:
        assert by_op[(customer, 3)]["seen"] == [f"{customer} note {n}: parcel {n} late" for n in range(3)]
        assert f"revised: {customer} note 0: parcel 0 late" in by_op[(customer, 5)]["seen"]  # seen by the delete
    assert {d.metadata["kind"] for d in replays["before"]} == {"version", "tombstone"}


def test_the_same_agent_replays_with_memory_as_of_the_savepoint_and_changes_it_as_production_did(
        production, replays):
    report, capture_topic, as_of = replays["same"]
    assert report.summary["compared"] == len(AFTER)
    assert report.differing == [], report.render_text()  # as-of view: the post-savepoint writes were unseen
    with ChromaVectorStore(production.chroma_url) as store:
        diff = memory_diff(store, NAMESPACE, as_of=as_of, replay=capture_topic, keys=CUSTOMERS)
    assert sorted((s.key, s.status) for s in diff.scopes) == [(c, "same") for c in CUSTOMERS], diff.render_text()
    assert [c.event for c in diff.scopes[0].replay] == ["UPDATE", "ADD", "DELETE"]


def test_a_changed_agent_shows_its_memory_changes_next_to_productions(production, replays, capsys):
    report, capture_topic, as_of = replays["changed"]
    # Its later reads see its own rewording (the overlay), where production's saw the revision.
    assert sorted((run.key, run.seq) for run in report.differing) == [(c, seq) for c in CUSTOMERS for seq in (5, 6)]
    assert all(any(m.startswith("reworded: ") for m in run.replay[0]["seen"]) for run in report.differing)
    assert cli_main(["memory", "diff", "--store", production.chroma_url, "--namespace", NAMESPACE,
                     "--replay", capture_topic, "--as-of", str(as_of)]) == 0
    printed = capsys.readouterr().out
    assert f"scopes {len(CUSTOMERS)}, same 0, changed {len(CUSTOMERS)}" in printed
    assert "UPDATE" in printed and "'reworded: " in printed and "'revised: " in printed


def test_production_memory_is_untouched_and_the_overlays_are_cleaned(production, replays, capsys):
    assert replays["after"] == replays["before"]  # ids, texts, vectors and metadata, every document
    overlays = [overlay_namespace(NAMESPACE, replays[name][1]) for name in ("same", "changed")]
    assert all(len(dump(production.chroma_url, overlay)) == 3 * len(CUSTOMERS) for overlay in overlays)
    for name in ("same", "changed"):
        assert cli_main(["memory", "clean", "--store", production.chroma_url, "--replay", replays[name][1]]) == 0
    assert all(dump(production.chroma_url, overlay) == [] for overlay in overlays)
    assert dump(production.chroma_url, NAMESPACE) == replays["before"]
    assert "deleted 1 overlay namespace(s)" in capsys.readouterr().out
