"""A chat model resource that answers from a script, for engine-level tests of tool loops."""

from __future__ import annotations

from flink_agents_replay import ChatResult
from flink_agents_replay.api.resources import Resource, SideEffects


class ScriptedModel(Resource):
    """A chat model answering from a script: the tool calls of each turn, then text."""

    def __init__(self, turns):
        super().__init__(side_effects=SideEffects.NONE)
        self.turns = list(turns)

    def invoke(self, **kwargs):
        calls = self.turns.pop(0) if self.turns else ()
        return ChatResult(content=None if calls else "done", tool_calls=tuple(calls),
                          finish_reason="tool_calls" if calls else "stop")
