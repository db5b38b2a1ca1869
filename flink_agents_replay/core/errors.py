"""Errors users of this package can see, each saying what happened and what to do."""

from __future__ import annotations

__all__ = [
    "AgentDefinitionError",
    "AttemptFencedError",
    "CallBlocked",
    "CallInDoubtError",
    "CallTimeoutError",
    "ChatModelError",
    "ConfigError",
    "FlinkAgentsReplayError",
    "FingerprintMismatchError",
    "JournalClosedError",
    "JournalError",
    "JournalGapError",
    "JournalRecordTooLargeError",
    "McpCallInDoubtError",
    "McpConnectionError",
    "McpProtocolError",
    "McpToolError",
    "MemoryNotFoundError",
    "NoSubAgentOutputError",
    "NotPicklableError",
    "ReconcileError",
    "ReplayConfigError",
    "ReplayError",
    "ReplayIsolationError",
    "RunSlotTimeoutError",
    "ToolLoopLimitError",
    "SignatureError",
    "SubAgentCycleError",
    "SubAgentTimeoutError",
    "TopicMismatchError",
    "UnknownResourceError",
    "UnknownSubAgentError",
]


class FlinkAgentsReplayError(Exception):
    """Base class of this package's errors."""


#: The base class's name before 0.2.0, kept so that ``except ReplayError`` goes on working. ("Replay" now
#: names only the feature that runs a changed agent against recorded traffic.)
ReplayError = FlinkAgentsReplayError


class ConfigError(FlinkAgentsReplayError, ValueError):
    """The configuration given is invalid; the message names the setting and the fix."""


class AgentDefinitionError(FlinkAgentsReplayError, TypeError):
    """An agent class is malformed (an action without event types, a resource of an unknown kind...)."""


class UnknownResourceError(FlinkAgentsReplayError, KeyError):
    """``ctx.call`` named a resource the agent does not register."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class NotPicklableError(FlinkAgentsReplayError, TypeError):
    """An event or memory value cannot be serialized with cloudpickle (it could not be journaled)."""


#: In the message of an error that fails the job for good: restarting cannot help (the same input would fail the
#: same way), so the checkpoint bridge turns it into a failure Flink does not restart.
NO_RESTART_MARKER = "[flink-agents-replay: not restarted]"


class JournalError(FlinkAgentsReplayError, RuntimeError):
    """The journal (Kafka) could not be reached, written or read."""


class TopicMismatchError(JournalError):
    """The journal topic exists with a layout this job cannot use (e.g. another partition count)."""


class SignatureError(JournalError):
    """A journal record failed verification: written with another key, by another job, or tampered with."""


class JournalRecordTooLargeError(JournalError):
    """A journal record is larger than Kafka accepts (memory or a call result grew past ``message.max.bytes``).

    Deterministic: the same input would produce the same record again, so the job fails without restarts.
    """


class JournalClosedError(JournalError):
    """The subtask closed its journal: a run it abandoned (a hung call) must not write after the next attempt
    started reading."""


class JournalGapError(JournalError):
    """Records recovery needs were deleted (e.g. restoring an older savepoint after later pruning)."""


class FingerprintMismatchError(FlinkAgentsReplayError, RuntimeError):
    """A journaled action was written by other action code and the policy says ``fail``."""


class CallTimeoutError(FlinkAgentsReplayError, TimeoutError):
    """A resource call did not return within the resource's ``timeout_s``; it may still take effect (in doubt)."""


class CallInDoubtError(FlinkAgentsReplayError, RuntimeError):
    """A call started before a failure and never reported back; its resource's policy says ``fail``."""


class ReconcileError(CallInDoubtError):
    """A reconciler could not tell whether a call in doubt took effect.

    Raised by a reconciler (:class:`~flink_agents_replay.api.resources.Reconciler`) to say so, it is retried; raised
    by ``ctx.call`` once its retries are spent, the call stays in doubt and the next attempt reconciles it again."""


class UnknownSubAgentError(AgentDefinitionError, KeyError):
    """``ctx.call_agent`` named an agent the calling agent does not register as a sub-agent."""


class SubAgentCycleError(AgentDefinitionError):
    """A sub-agent call would call an agent already on the call path (parent -> child -> parent)."""


class NoSubAgentOutputError(FlinkAgentsReplayError, RuntimeError):
    """A sub-agent call finished without the child sending any OutputEvent."""


class SubAgentTimeoutError(FlinkAgentsReplayError, TimeoutError):
    """A sub-agent call did not finish within its ``timeout``."""


class ReplayConfigError(ConfigError):
    """A replay cannot start as configured: a savepoint, capture or manifest that does not fit the job."""


class ReplayIsolationError(ReplayConfigError):
    """A replay was configured to write to a production topic (its journal, capture or outputs)."""


class CallBlocked(FlinkAgentsReplayError, RuntimeError):  # noqa: N818 - the name the design gives it
    """A replay's side-effect policy did not make this call (``blocked``, or ``recorded`` without a record).

    Raised by ``ctx.call`` in a replay; an action may catch it and go on. The call is listed in the replay's
    report with its arguments.
    """

    def __init__(self, message: str, resource: str = "", arguments: str = ""):
        super().__init__(message)
        self.resource = resource
        self.arguments = arguments

    def __reduce__(self):
        return (type(self), (str(self), self.resource, self.arguments))


class ChatModelError(RuntimeError):
    """A chat model's reply this package cannot use (no choices, structured output that is not JSON, no text for
    a prompt). The service's own errors are the ``openai`` SDK's exceptions; 0.4 and earlier raised this one for
    HTTP failures too, and journals keep those."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    def __reduce__(self):
        return (type(self), (str(self), self.status))

    @property
    def transient(self) -> bool:
        """Worth trying again: the endpoint was unreachable, rate-limited (429) or failed itself (5xx)."""
        return self.status is None or self.status == 429 or self.status >= 500


class ToolLoopLimitError(FlinkAgentsReplayError, RuntimeError):
    """A tool loop's model still asked for tools after ``max_turns`` turns."""


class RunSlotTimeoutError(FlinkAgentsReplayError, TimeoutError):
    """No agent run finished within ``slot_wait_timeout_s`` while every run slot was taken: a call may hang."""


class MemoryNotFoundError(FlinkAgentsReplayError, KeyError):
    """A long-term memory ``update`` or ``delete`` of a memory id the call does not see (deleted already, never
    written, or another key's)."""

    def __str__(self) -> str:  # KeyError's would quote the whole message
        return str(self.args[0]) if self.args else "no such memory"


class WaitTimedOutError(FlinkAgentsReplayError, TimeoutError):
    """``ctx.wait_for`` without ``on_timeout``: no decision came before the wait's deadline."""


class WaitNotSupportedError(FlinkAgentsReplayError, RuntimeError):
    """``ctx.wait_for`` where a run cannot wait: inside a sub-agent, or under a runtime that cannot park runs."""


class ToolCallDeniedError(FlinkAgentsReplayError, RuntimeError):
    """A call to a tool that needs approval was denied (or its approval timed out): the tool was not called.

    ``run_tool_loop`` tells the model so, with the reason; a direct ``ctx.call`` raises it into the action.
    """

    def __init__(self, tool: str, reason: str | None = None):
        super().__init__(f"the call to {tool!r} was denied" + (f": {reason}" if reason else ""))
        self.tool = tool
        self.reason = reason

    def __reduce__(self):  # pickles (journaled, captured) with both arguments
        return type(self), (self.tool, self.reason)


class McpToolError(FlinkAgentsReplayError, RuntimeError):
    """An MCP tool answered its call with an error result (``isError: true``): the server ran the tool and it
    failed. ``text`` keeps what the server said (its text content joined)."""

    def __init__(self, tool: str, text: str, server: str = ""):
        super().__init__(f"the MCP tool {tool!r}{f' of {server}' if server else ''} failed: {text}")
        self.tool = tool
        self.text = text
        self.server = server

    def __reduce__(self):  # pickles (journaled, captured) with its arguments
        return type(self), (self.tool, self.text, self.server)


class McpProtocolError(FlinkAgentsReplayError, RuntimeError):
    """An MCP server refused a request with a JSON-RPC error (an unknown tool, invalid arguments...). ``code`` is
    the JSON-RPC error code and ``text`` its message, as the server sent them."""

    def __init__(self, tool: str, text: str, code: int | None = None, server: str = ""):
        super().__init__(f"the MCP server{f' {server}' if server else ''} refused the call to {tool!r}"
                         f"{f' (error {code})' if code is not None else ''}: {text}")
        self.tool = tool
        self.text = text
        self.code = code
        self.server = server

    def __reduce__(self):
        return type(self), (self.tool, self.text, self.code, self.server)


class McpConnectionError(FlinkAgentsReplayError, ConnectionError):
    """An MCP server could not be reached, or its session broke, on every attempt of a call (the transport's
    retries are spent). The call's action fails as with any exception."""


class McpCallInDoubtError(CallTimeoutError):
    """An MCP call's request was sent and the session broke before its answer: it may have taken effect. A
    :class:`CallTimeoutError`, not an :class:`McpConnectionError` (which says nothing was sent): nothing is journaled
    as its outcome, and after the action fails the next attempt finds the call in doubt (an ``external`` tool's
    policy decides, under the same call id). An action must not catch it and call again: that is a new call, under
    a new id."""


class AttemptFencedError(JournalClosedError):
    """A newer attempt of this subtask started on the call's partition (Flink restored the task elsewhere): this
    attempt is a zombie, and its call is not made. A :class:`JournalClosedError`: the action journals no failure
    (the next attempt owns the partition), and the run ends as runs end when the operator closes."""
