"""The run engine: one input of one key through an agent, durably, with no Flink in sight.

The Flink operator hands the engine an input (:class:`RunInput`), the key's memory, the key's recovered
history (after a restore) and a journal to write to; the engine runs every action the input triggers and
hands back a :class:`RunResult` (new memory, outputs, counts). What already happened in an earlier attempt
is *reused* from the history instead of being done again. Because nothing here touches Flink, all of it
runs in unit tests on the in-memory journal store.

Modules, from the outside in:

* :mod:`.run`: :func:`execute_run` and the event loop (the FIFO of (event, action) tasks): a journaled
  completion is reused, a cut-short action re-executed with its journaled calls, a diverged history cut;
* :mod:`.action`: one action execution: the ``RunnerContext``, the completion record, the failure record;
* :mod:`.calls`: ``ctx.call`` (:class:`ActionCalls`): positions, reuse of journaled calls, calls in doubt,
  the call gate, call ids, journaling of started / returned / raised;
* :mod:`.children`: ``ctx.call_agents``, the fan-out to sub-agents, journaled like calls;
* :mod:`.failures`: which failed calls the next attempt makes again after an exception left an action;
* :mod:`.gate`: :class:`CallGate`, through which a feature (a replay's side-effect policy) decides whether
  a call is made for real; production's is :data:`ALWAYS_LIVE`;
* :mod:`.context`: what a run's parts share (input, counters, context, scope, action site).

The engine depends on the agent API, memory, resources and the journal's records, index and writer; it
knows nothing of the operator, capture or replay, which plug in from above.
"""

from flink_agents_replay.engine.action import explain_unpicklable
from flink_agents_replay.engine.calls import ActionCalls, call_id
from flink_agents_replay.engine.children import SUB_AGENT_MEMORY
from flink_agents_replay.engine.context import FingerprintPolicy, RunCancelled, RunInput, RunStats
from flink_agents_replay.engine.gate import ALWAYS_LIVE, Blocked, CallGate, GatedCall, GateDecision, Live, Recorded
from flink_agents_replay.engine.run import RunResult, execute_run

__all__ = ["ALWAYS_LIVE", "SUB_AGENT_MEMORY", "ActionCalls", "Blocked", "CallGate", "FingerprintPolicy",
           "GateDecision", "GatedCall", "Live", "Recorded", "RunCancelled", "RunInput", "RunResult", "RunStats",
           "call_id", "execute_run", "explain_unpicklable"]
