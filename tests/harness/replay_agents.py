"""A triage agent for replay tests: a chat model, an idempotent lookup, an external notification.

``replay_triage_agent(changed=False)`` is the production agent; ``changed=True`` is the same agent with
one action's code changed (``reply`` asks the model differently for refund tickets), so exactly the
refund tickets get another output when the model is called live. Each output carries the event time the
action saw (``ctx.event_time``) and the customer's ticket count (short-term memory restored from the
savepoint).

Real invocations are counted outside the Flink worker: the chat model and the lookup by the stub
service (:class:`~flink_agents_replay.local.model_server.StubModelServer` statistics), the notification
in an :class:`~flink_agents_replay.testing.counter.InvocationCounter` file (``notify`` and
``notify:<ticket>``).
"""

from __future__ import annotations

from typing import Any

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.core.errors import CallBlocked
from flink_agents_replay.examples.support_triage import CATEGORIES, OrderLookup
from flink_agents_replay.testing.counter import InvocationCounter

__all__ = ["replay_triage_agent"]


class Classified(Event):
    """The ticket, its category and the event time the first action saw."""


class Looked(Event):
    """... and the order."""


class ReplayTriage(Agent):
    """Classify (model), look up the order (idempotent tool), reply (model) and notify (external tool)."""

    @action(InputEvent)
    def classify(event, ctx):
        ticket = event.input
        category = ctx.call("llm", prompt=f"Categories: {', '.join(CATEGORIES)}\n{ticket['text']}").strip().lower()
        ctx.send_event(Classified(ticket=ticket, category=category, event_time=ctx.event_time))

    @action(Classified)
    def look_up(event, ctx):
        order = ctx.call("orders", event.ticket["order_id"]) if event.ticket.get("order_id") else {"status": "none"}
        ctx.send_event(Looked(ticket=event.ticket, category=event.category, event_time=event.event_time,
                              order=order))

    @action(Looked)
    def reply(event, ctx):
        ReplayTriage._finish(event, ctx, ctx.call("llm", prompt=f"Reply to: {event.ticket['text']}"))

    @staticmethod
    def _finish(event, ctx, reply: str) -> None:
        earlier = ctx.memory.get("tickets", 0)
        ctx.memory.set("tickets", earlier + 1)
        try:  # a replay blocks it by default: the action handles that and still answers
            ctx.call("notify", event.ticket["customer"], event.ticket["ticket_id"])
        except CallBlocked:
            pass
        ctx.send_event(OutputEvent(output={
            "ticket_id": event.ticket["ticket_id"], "customer": event.ticket["customer"],
            "category": event.category, "order_status": event.order.get("status"), "reply": reply,
            "customer_ticket_number": earlier + 1, "event_time": event.event_time,
        }))


class ChangedReplayTriage(ReplayTriage):
    """The changed agent: refund tickets get a reply asked for differently (other code: another fingerprint)."""

    @action(Looked)
    def reply(event, ctx):
        prompt = f"Reply to: {event.ticket['text']}"
        if event.category == "refund":
            prompt = f"Reply kindly and offer a voucher to: {event.ticket['text']}"
        ReplayTriage._finish(event, ctx, ctx.call("llm", prompt=prompt))


def replay_triage_agent(counter: InvocationCounter, base_url: str, *, changed: bool = False,
                        name: str = "replay-triage") -> Agent:
    """The agent, with its model and lookup at the stub service ``base_url`` (without ``/v1``)."""

    def notify(customer: str, ticket_id: str) -> dict[str, Any]:
        counter.increment("notify")
        counter.increment(f"notify:{ticket_id}")
        return {"sent_to": customer, "ticket_id": ticket_id}

    agent_type = ChangedReplayTriage if changed else ReplayTriage
    return agent_type(name=name, resources={
        "llm": ChatModel("stub-model", base_url=f"{base_url}/v1", retries=0),
        "orders": Tool(OrderLookup(base_url), side_effects="idempotent"),
        "notify": Tool(notify, side_effects="external"),
    })
