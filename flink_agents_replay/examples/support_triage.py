"""A support-ticket triage agent: classify with a chat model, let the model look up the order, draft a reply.

Each input is a ticket ``{"ticket_id", "customer", "order_id", "text"}``, keyed by customer. The agent
runs two actions, each a journaled step:

1. ``classify`` (on the input): asks the chat model for one of :data:`CATEGORIES`;
2. ``draft_reply`` (on ``Classified``): a tool loop (:func:`flink_agents_replay.api.tool_loop.run_tool_loop`): the
   model is given the ticket, the category, how many tickets this customer opened before (short-term memory)
   and the order-lookup tool ``orders``; it calls the tool when the ticket names an order, then writes the
   reply. Every model turn and every lookup is its own journaled call. The output event is
   ``{"ticket_id", "customer", "category", "order_status", "customer_ticket_number", "reply"}``.

With a long-term memory store (``support_triage_agent(memory_url=...)``, a Chroma server) the agent also
remembers: ``draft_reply`` searches the customer's past issues (``ctx.call("memory", "search", ...)``),
mentions them to the model, lists them in the output (``past_issues``: their ticket ids) and remembers the
ticket. Those memories outlive the job; the searches and writes are journaled like any call.

With refunds (``support_triage_agent(refund_approval_above=...)``) ``draft_reply`` also refunds a refund ticket's
order through the ``issue_refund`` tool (``external``: money goes out). A refund above the amount needs a person's
approval: the run waits (``Tool(needs_approval=...)``, :meth:`~flink_agents_replay.api.agent.RunnerContext.wait_for`)
until a decision comes or ``approval_timeout_s`` passes; a denied or unanswered one is declined in the reply.

With ``support_triage_agent(orders_mcp_url=...)`` the ``orders`` tool is an MCP server's ``lookup_order``
(:func:`flink_agents_replay.api.mcp_tools.mcp_tools`, e.g. :mod:`flink_agents_replay.local.mcp_orders_server`, as in
the demo): the call id goes to it in the request's ``_meta``.

Both services receive the call's stable id as an ``Idempotency-Key`` header
(:func:`flink_agents_replay.api.resources.current_call_id`), so a service that honours it (the local stub
service does) answers a call made again after a crash — one that was *in doubt* — without doing the work
twice. Point the model at any OpenAI-compatible endpoint (OpenAI, Ollama, vLLM, a LiteLLM proxy) with
``model_base_url`` (:mod:`flink_agents_replay.api.chat_model` lists the settings of each).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated, Any

from pydantic import Field

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.chat_model import ChatModel
from flink_agents_replay.api.mcp_tools import McpServer, mcp_tools
from flink_agents_replay.api.resources import Tool, current_call_id
from flink_agents_replay.api.tool_loop import run_tool_loop
from flink_agents_replay.core.errors import ToolCallDeniedError
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings

__all__ = ["CATEGORIES", "OrderLookup", "RefundService", "RefundingSupportTriage", "RememberingRefundingSupportTriage",
           "RememberingSupportTriage", "RememberingSupportTriageV2", "SupportTriage", "SupportTriageV2", "make_tickets",
           "produce_tickets", "support_triage_agent", "support_triage_agent_v2"]

CATEGORIES = ("refund", "shipping", "account", "other")
_SYSTEM = ("You are a support agent. Look up the order with the orders tool when the ticket names one, then "
           "answer the customer.")


class Classified(Event):
    """The ticket and its category."""


class OrderLookup:
    """The order-lookup tool: ``GET <base_url>/orders/<order_id>`` returning the order as JSON."""

    def __init__(self, base_url: str, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def __call__(self, order_id: Annotated[str, Field(pattern=r"O-\d{5}")]) -> dict[str, Any]:
        """Look up an order: its status, items, total and carrier.

        Args:
            order_id: the order's id, like O-12345.
        """
        headers = {"Accept": "application/json"}
        call_id = current_call_id()
        if call_id is not None:
            headers["Idempotency-Key"] = call_id
        request = urllib.request.Request(f"{self.base_url}/orders/{order_id}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return {"order_id": order_id, "status": "not found"}
            raise


class RefundService:
    """The refund tool: ``POST <base_url>/refunds`` with ``{"order_id", "amount"}``, the call id as its
    ``Idempotency-Key`` (a refund made again after a crash pays once)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def __call__(self, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order.

        Args:
            order_id: the order's id.
            amount: how much to pay back.
        """
        headers = {"Content-Type": "application/json", "Idempotency-Key": current_call_id() or ""}
        body = json.dumps({"order_id": order_id, "amount": amount}).encode()
        request = urllib.request.Request(f"{self.base_url}/refunds", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return json.loads(response.read())


class AmountAbove:
    """``needs_approval`` of the refund tool: a refund above ``limit`` needs a person's approval."""

    def __init__(self, limit: float):
        self.limit = limit

    def __call__(self, arguments: dict[str, Any]) -> bool:
        return arguments["amount"] > self.limit


class SupportTriage(Agent):
    """Classify, then let the model look up the order and draft a reply; remembers each customer's tickets."""

    @action(InputEvent)
    def classify(event, ctx):
        ticket = event.input
        category = ctx.call("llm", prompt=(
            "Classify this customer support ticket into exactly one category.\n"
            f"Categories: {', '.join(CATEGORIES)}\n"
            f"Ticket {ticket['ticket_id']}: {ticket['text']}"
        )).strip().lower()
        if category not in CATEGORIES:  # a real model may answer in prose
            category = "other"
        ctx.send_event(Classified(ticket=ticket, category=category))

    @action(Classified)
    def draft_reply(event, ctx):
        SupportTriage._reply(event, ctx, "Draft a short, friendly reply")

    @staticmethod
    def _reply(event, ctx, instruction: str, past_issues: list[str] | None = None,
               background: str | None = None, refund: bool = False) -> None:
        ticket = event.ticket
        earlier = ctx.memory.get("tickets", [])
        # Background (past issues) in the system message: the ticket itself is what the model acts on.
        answer = run_tool_loop(ctx, "llm", tools=["orders"], max_turns=3, messages=[
            {"role": "system", "content": _SYSTEM + (f"\n{background}" if background else "")},
            {"role": "user", "content": (
                f"{instruction} to a {event.category} ticket. The customer opened {len(earlier)} ticket(s) "
                f"before.\nTicket {ticket['ticket_id']}: {ticket['text']}")}])
        looked_up = [result for call, result in answer.tool_calls if call.name == "orders"]
        ctx.memory.set("tickets", [*earlier, ticket["ticket_id"]][-20:])
        output = {"ticket_id": ticket["ticket_id"], "customer": ticket["customer"], "category": event.category,
                  "order_status": looked_up[-1].get("status") if looked_up else "no order given",
                  "customer_ticket_number": len(earlier) + 1, "reply": answer.content}
        if past_issues is not None:
            output["past_issues"] = past_issues
        if refund and event.category == "refund" and looked_up and "total" in looked_up[-1]:
            output["refund"] = SupportTriage._refund(ctx, looked_up[-1])
        ctx.send_event(OutputEvent(output=output))

    @staticmethod
    def _refund(ctx, order: dict[str, Any]) -> str:
        """Refund the order: paid, or declined when a person denied it (or did not decide in time)."""
        try:
            return ctx.call("issue_refund", order["order_id"], amount=order["total"])["refund_id"]
        except ToolCallDeniedError as denied:
            return f"declined: {denied.reason or 'denied'}"


def _voucher_instruction(category: str) -> str:
    if category == "refund":
        return "Draft a short, friendly reply that offers a 10% voucher"
    return "Draft a short, friendly reply"


class SupportTriageV2(SupportTriage):
    """A change to try in a replay before shipping it: refund tickets get a reply that offers a voucher."""

    @action(Classified)
    def draft_reply(event, ctx):
        SupportTriage._reply(event, ctx, _voucher_instruction(event.category))


class RememberingSupportTriage(SupportTriage):
    """:class:`SupportTriage` that also remembers each customer's issues in long-term memory."""

    @action(Classified)
    def draft_reply(event, ctx):
        RememberingSupportTriage._reply_remembering(event, ctx, "Draft a short, friendly reply")

    @staticmethod
    def _reply_remembering(event, ctx, instruction: str, refund: bool = False) -> None:
        ticket = event.ticket
        # With the ticket id, each search and each memory is a request of its own (the local service counts
        # equal requests as repeated).
        found = ctx.call("memory", "search", f"{ticket['text']} (ticket {ticket['ticket_id']})", limit=3)["results"]
        past = [f"{m['memory']} ({m['metadata']['category']})" for m in found]
        SupportTriage._reply(event, ctx, instruction, past_issues=[m["metadata"]["ticket_id"] for m in found],
                             background=f"The customer's past issues: {'; '.join(past)}" if past else None,
                             refund=refund)
        ctx.call("memory", "add", f"{ticket['ticket_id']}: {ticket['text']}",
                 metadata={"ticket_id": ticket["ticket_id"], "category": event.category})


class RefundingSupportTriage(SupportTriage):
    """:class:`SupportTriage` that also refunds refund tickets (a large refund waits for approval)."""

    @action(Classified)
    def draft_reply(event, ctx):
        SupportTriage._reply(event, ctx, "Draft a short, friendly reply", refund=True)


class RememberingRefundingSupportTriage(RememberingSupportTriage):
    """:class:`RememberingSupportTriage` that also refunds refund tickets (a large refund waits for approval)."""

    @action(Classified)
    def draft_reply(event, ctx):
        RememberingSupportTriage._reply_remembering(event, ctx, "Draft a short, friendly reply", refund=True)


class RememberingSupportTriageV2(RememberingSupportTriage):
    """:class:`SupportTriageV2`'s change, with long-term memory."""

    @action(Classified)
    def draft_reply(event, ctx):
        RememberingSupportTriage._reply_remembering(event, ctx, _voucher_instruction(event.category))


def support_triage_agent_v2(**settings: Any) -> SupportTriage:
    """:func:`support_triage_agent` with the changed reply of :class:`SupportTriageV2` (same settings)."""
    agent = support_triage_agent(**settings)
    changed = RememberingSupportTriageV2 if isinstance(agent, RememberingSupportTriage) else SupportTriageV2
    return changed(name=agent.name, resources=agent.resources)


def support_triage_agent(*, name: str = "support-triage", model: str = "stub-model",
                         model_base_url: str = "http://127.0.0.1:8000/v1", orders_base_url: str | None = None,
                         api_key: str | None = None, memory_url: str | None = None,
                         embedding_model: str = "stub-embeddings", refund_approval_above: float | None = None,
                         approval_timeout_s: float = 60.0, orders_mcp_url: str | None = None) -> SupportTriage:
    """The agent with its resources: chat model ``llm`` and the order-lookup tool ``orders`` the model may call
    (and with ``memory_url``, long-term memory ``memory``).

    Args:
        name: the agent's name; it derives the operator uid and the journal topic, so keep it stable.
        model: model name sent to the endpoint.
        model_base_url: OpenAI-compatible API root (``.../v1``).
        orders_base_url: root of the order service (default: ``model_base_url`` without ``/v1``, where the
            local stub service answers both).
        api_key: bearer token for the model endpoint (default ``$OPENAI_API_KEY``).
        memory_url: a Chroma server for long-term memory (``flink-agents-replay local chroma start`` prints
            one); ``None``: no long-term memory.
        embedding_model: the embedding model, at ``model_base_url``'s ``/embeddings``.
        refund_approval_above: refund refund tickets through ``issue_refund`` (at the order service), a refund
            above this amount only once a person approved it; ``None``: no refunds.
        approval_timeout_s: how long a refund waits for its approval before it is declined.
        orders_mcp_url: an MCP server's streamable HTTP endpoint whose ``lookup_order`` tool is ``orders``
            (listed now: a server out of reach raises :class:`~flink_agents_replay.core.errors.McpConnectionError`);
            ``None``: ``orders`` is ``GET <orders_base_url>/orders/<id>``. Refunds stay at ``orders_base_url``.
    """
    if orders_base_url is None:
        orders_base_url = model_base_url.rstrip("/").removesuffix("/v1")
    if orders_mcp_url is None:
        # Reading an order changes nothing: a call in doubt is simply made again.
        orders: Tool = Tool(OrderLookup(orders_base_url), side_effects="none", name="orders")
    else:
        # The MCP spec says not to trust a server's annotations; this agent trusts the orders server it is given
        # (the demo's own), whose lookup_order is annotated read-only: "none", as the HTTP lookup above is.
        orders = mcp_tools(McpServer(url=orders_mcp_url), trust_annotations=True,
                           rename={"lookup_order": "orders"})["orders"]
    resources: dict[str, Any] = {"llm": ChatModel(model, base_url=model_base_url, api_key=api_key), "orders": orders}
    refunds = refund_approval_above is not None
    if refunds:
        resources["issue_refund"] = Tool(RefundService(orders_base_url), side_effects="external", name="issue_refund",
                                         needs_approval=AmountAbove(refund_approval_above),
                                         approval_timeout_s=approval_timeout_s)
    if memory_url is None:
        return (RefundingSupportTriage if refunds else SupportTriage)(name=name, resources=resources)
    resources["memory"] = LongTermMemory(ChromaVectorStore(memory_url), OpenAIEmbeddings(
        embedding_model, base_url=model_base_url, api_key=api_key))
    return (RememberingRefundingSupportTriage if refunds else RememberingSupportTriage)(name=name, resources=resources)


_TEMPLATES = (
    ("I want a refund for order {order}: the {item} arrived broken.", True),
    ("Where is my package? Order {order} was due three days ago.", True),
    ("I cannot log into my account since the password reset.", False),
    ("The {item} from order {order} is the wrong size, can I get a refund?", True),
    ("Shipping to my new address: can you change it for order {order}?", True),
    ("Do you sell gift cards?", False),
    ("My account shows an old e-mail address, please update it.", False),
    ("The tracking page for order {order} says shipping is delayed.", True),
)
_ITEMS = ("kettle", "jacket", "lamp", "headphones", "backpack", "blender")


def make_tickets(count: int, customers: int = 40, *, start: int = 0) -> list[dict[str, Any]]:
    """``count`` deterministic tickets over ``customers`` customers (ticket ids ``T-00000``...)."""
    tickets = []
    for n in range(start, start + count):
        template, has_order = _TEMPLATES[(n * 7 + n // 5) % len(_TEMPLATES)]
        order = f"O-{10_000 + (n * 37) % 9_000}"
        tickets.append({
            "ticket_id": f"T-{n:05d}",
            "customer": f"customer-{(n * 13) % customers:03d}",
            "order_id": order if has_order else None,
            "text": template.format(order=order, item=_ITEMS[n % len(_ITEMS)]),
        })
    return tickets


def produce_tickets(producer, topic: str, tickets: list[dict[str, Any]]) -> None:
    """Hand ``tickets`` to a confluent-kafka ``producer`` as JSON, keyed by customer (a customer's tickets
    share a partition, so they keep their order); the caller flushes."""
    for ticket in tickets:
        producer.produce(topic, key=ticket["customer"].encode(), value=json.dumps(ticket).encode())
        producer.poll(0)
