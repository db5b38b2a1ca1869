"""Long-term memory across a fail-over, on a Flink MiniCluster, a real Kafka broker, the project's Chroma
server and the local model service's embeddings (outside the Flink worker, where real requests are counted).

The agent searches a customer's memories for what the ticket is about, answers with what it found, and
remembers the ticket; one ticket's action raises once, after its add. The job fails over once mid-stream.
Invariants: every answer committed once and equal to a failure-free run's (which a search seeing a
duplicate, or missing a memory, would change); each customer's memory holds each ticket once; every
embedding request executed once (a reused search or add asks nothing); and the restore did reuse memory
calls from the journal (the fault hit runs that had used the memory).
"""

from __future__ import annotations

import re
import uuid
from collections import Counter

import pytest

from flink_agents_replay import Agent, InputEvent, OutputEvent, Tool, action
from flink_agents_replay.integrations.vector_store import Where
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings
from flink_agents_replay.testing import AgentTestEnvironment, FailOver, InvocationCounter

pytestmark = pytest.mark.integration

CUSTOMERS, TICKETS_EACH = 3, 4
_REPLAYED = re.compile(r"recovered journal fully replayed; so far actions executed (\d+), reused (\d+)")


class RememberingAgent(Agent):
    """Answers a ticket with the customer's past tickets (a search), then remembers it (an add). The first
    attempt at one ticket raises after its add (``raise_once``: a claim in a counter file, once per job)."""

    @action(InputEvent)
    def answer(event, ctx):
        ticket = event.input
        past = ctx.call("memory", "search", ticket["text"], limit=10)["results"]
        ctx.call("memory", "add", ticket["text"], metadata={"n": ticket["n"]})
        ctx.call("raise_once", ticket["customer"], ticket["n"])
        ctx.send_event(OutputEvent(output={"n": ticket["n"], "past": sorted(hit["memory"] for hit in past)}))


def raise_once(claims: InvocationCounter, customer: str, n: int):
    def check(key: str, seq: int) -> None:
        if (key, seq) == (customer, n) and claims.increment("raised") == 1:
            raise RuntimeError(f"the action of {key}/{seq} fails once, after its add")
    return check


def tickets() -> list[dict]:
    return [{"customer": f"c{k}", "n": n, "text": f"customer c{k} ticket {n}: parcel {100 * k + n} arrived late"}
            for n in range(TICKETS_EACH) for k in range(CUSTOMERS)]


def test_memory_calls_are_reused_after_a_fail_over_and_no_memory_is_duplicated(
        kafka_bootstrap, chroma_server, model_server, operator_log):
    model, url = model_server(), chroma_server.status().url
    name = f"remembering-{uuid.uuid4().hex[:6]}"
    memory = LongTermMemory(ChromaVectorStore(url), OpenAIEmbeddings("local-embed", base_url=model.base_url,
                                                                     api_key="unused"))
    with AgentTestEnvironment.from_bootstrap(kafka_bootstrap) as env:
        claims = InvocationCounter(env.work_dir / "raised.sqlite")
        resources = {"memory": memory, "raise_once": Tool(raise_once(claims, "c1", 2), side_effects="none")}
        result = env.run(RememberingAgent(name=name, resources=resources), inputs=tickets(),
                         key=lambda ticket: ticket["customer"], fail_over=FailOver(after_outputs=7))
        assert claims.count("raised") >= 1  # the exception after the add did fire

    assert result.failure is None, result.failure
    assert result.failed_over and result.duplicate_outputs() == []
    texts = {(t["customer"], t["n"]): t["text"] for t in tickets()}
    assert result.outputs_by_key() == {
        f"c{k}": [{"n": n, "past": sorted(texts[(f"c{k}", m)] for m in range(n))} for n in range(TICKETS_EACH)]
        for k in range(CUSTOMERS)}

    with ChromaVectorStore(url) as store:
        docs = store.get(f"{name}/memory", Where())
    assert Counter(d.text for d in docs) == Counter(texts.values())  # each ticket remembered once
    assert {d.metadata["valid_to"] for d in docs} == {2 ** 53 - 1}  # all current: nothing closed or re-added
    assert model.stats().embeddings == 2 * len(texts)  # one search and one add per ticket, none made again

    replayed = [tuple(map(int, m.groups())) for line in operator_log() if (m := _REPLAYED.search(line))]
    # The fault hit: the restore reused at least the actions whose answers were out before it, memory calls and all.
    assert replayed and sum(reused for _, reused in replayed) >= 7, replayed
