"""Agents for tests and benchmarks: chained actions with counted, optionally slow, optionally failing calls.

Every real tool invocation is counted in an :class:`~flink_agents_replay.testing.counter.InvocationCounter`
(a file outside the Flink worker) under ``call:<tool>:<argument>``, so a test can assert that each
*logical* call ran exactly once across failures and restarts. A fault raises :class:`InjectedFailure`
exactly once (the "fired" flag lives in the same file, so a restarted task does not fire it again).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

from flink_agents_replay.api.agent import Agent, Event, InputEvent, OutputEvent, action
from flink_agents_replay.api.resources import Tool
from flink_agents_replay.testing.counter import InvocationCounter

__all__ = ["InjectedFailure", "chain_agent", "logical_call_counts"]


class InjectedFailure(RuntimeError):
    """Raised once by a test agent to make Flink fail over."""


class Classified(Event):
    """First action's result."""


class Drafted(Event):
    """Second action's result."""


def logical_call_counts(counter: InvocationCounter) -> dict[str, int]:
    """How often each logical call (tool and argument) really ran."""
    return {name: n for name, n in counter.counts().items() if name.startswith("call:")}


def _counted_tool(counter: InvocationCounter, tool_name: str, call_delay_s: float, traced: bool) -> Callable:
    """A tool that counts its real invocations (``call:<tool>:<argument>``), optionally slow and traced."""

    def invoke(argument: str) -> str:
        counter.increment(f"call:{tool_name}:{argument}")
        counter.increment("calls")
        if call_delay_s:
            time.sleep(call_delay_s * (0.5 + zlib.crc32(argument.encode()) % 1000 / 1000 if traced else 1))
        if traced:
            counter.increment(f"done:{tool_name}:{argument}")
        return f"{tool_name}({argument})"

    invoke.__qualname__ = tool_name
    return invoke


def chain_agent(counter: InvocationCounter, *, name: str = "chain", call_delay_s: float = 0.0,
                fail_after_calls: int | None = None, before_failure: Callable[[], None] | None = None,
                memory_value: Callable[[], Any] | None = None, traced: bool = False) -> Agent:
    """3 chained actions per input, 2 journaled calls each; memory keeps the key's history.

    With ``fail_after_calls=N``, the first action raises :class:`InjectedFailure` between its two calls
    once N calls have run in total (once per counter file), after calling ``before_failure`` if given.
    ``memory_value`` makes the first action also store its result under memory path ``extra.value``.
    ``traced`` also counts ``done:<tool>:<argument>`` when a call returns (a snapshot of the file right after
    a SIGKILL then tells the calls under way: begun more often than done), and varies each call's delay from
    0.5x to 1.5x ``call_delay_s``, fixed per call, so that keys drift apart and a kill finds varied calls.
    """

    def maybe_fail() -> None:
        if fail_after_calls is None or counter.count("fault_fired") or counter.count("calls") < fail_after_calls:
            return
        # Several runs may get here at once: the one whose claim is first fires, exactly once per file.
        if counter.increment("fault_claims") == 1:
            counter.increment("fault_fired")
            if before_failure is not None:
                before_failure()
            raise InjectedFailure(f"injected failure after {counter.count('calls')} calls")

    class ChainAgent(Agent):
        @action(InputEvent)
        def classify(event, ctx):
            label = ctx.call("classifier", f"{ctx.key}|{ctx.seq}|{event.input}")
            maybe_fail()  # between the action's two calls
            detail = ctx.call("lookup", label)
            history = ctx.memory.get("history", [])
            ctx.memory.set("history", [*history, event.input])
            if memory_value is not None:
                ctx.memory.set("extra.value", memory_value())
            ctx.send_event(Classified(label=label, detail=detail))

        @action(Classified)
        def draft(event, ctx):
            text = ctx.call("writer", event.detail)
            checked = ctx.call("checker", text)
            ctx.send_event(Drafted(text=checked))

        @action(Drafted)
        def reply(event, ctx):
            sent = ctx.call("sender", event.text)
            receipt = ctx.call("archiver", sent)
            ctx.send_event(OutputEvent(output={"receipt": receipt, "history": ctx.memory.get("history")}))

    tools = ("classifier", "lookup", "writer", "checker", "sender", "archiver")
    # "sender" acts on the world: its calls journal an acknowledged "started" record first.
    return ChainAgent(name=name, resources={
        t: Tool(_counted_tool(counter, t, call_delay_s, traced), side_effects="external" if t == "sender" else "none")
        for t in tools})
