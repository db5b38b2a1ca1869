"""The attribute names the package's spans carry: three vocabularies, each for its readers.

* **OpenTelemetry's semantic conventions for generative AI**, at :data:`SEMCONV_VERSION` (the schema URL every
  span's instrumentation scope names): what any OTLP backend understands of a model or tool call. Spelled out here
  rather than imported from ``opentelemetry.semconv._incubating``: that module is not a stable API, and a pinned
  version must not move when the SDK is upgraded.
* **OpenInference**, which Arize Phoenix reads to show a span as an LLM, tool or agent step with its token counts.
* **The package's own** (``flink_agents.*``): what no other tracer knows, the key, seq and call id, and whether a
  call was made by this execution, reused after a failure, served from production's records in a replay, or
  settled while in doubt.

Prompts and completions are never sent unless asked for (``TracingConfig.capture_content``, or OpenTelemetry's
standard ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
"""

from __future__ import annotations

__all__ = ["SEMCONV_VERSION", "SCHEMA_URL"]

#: The version of OpenTelemetry's semantic conventions the GenAI attributes follow.
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# OpenTelemetry GenAI (semconv 1.44.0)
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

# OpenInference (Phoenix)
OI_SPAN_KIND = "openinference.span.kind"
OI_PROJECT_NAME = "openinference.project.name"  # a resource attribute: Phoenix's project
OI_LLM_MODEL_NAME = "llm.model_name"
OI_LLM_PROVIDER = "llm.provider"
OI_TOKENS_PROMPT = "llm.token_count.prompt"
OI_TOKENS_COMPLETION = "llm.token_count.completion"
OI_TOKENS_TOTAL = "llm.token_count.total"
OI_TOOL_NAME = "tool.name"
OI_SESSION_ID = "session.id"
OI_INPUT_VALUE = "input.value"
OI_INPUT_MIME = "input.mime_type"
OI_OUTPUT_VALUE = "output.value"
OI_OUTPUT_MIME = "output.mime_type"
OI_AGENT, OI_CHAIN, OI_LLM, OI_TOOL = "AGENT", "CHAIN", "LLM", "TOOL"

# The package's own
FA = "flink_agents."
FA_AGENT = FA + "agent"
FA_KEY = FA + "key"
FA_SEQ = FA + "seq"
FA_LINEAGE = FA + "lineage"
FA_JOB_ID = FA + "job_id"
FA_ATTEMPT = FA + "attempt"
FA_SUBTASK = FA + "subtask"
FA_ACTION = FA + "action"
FA_EVENT_ID = FA + "event_id"
FA_ACTION_HOW = FA + "action.how"
FA_CALL_ID = FA + "call.id"
FA_CALL_HOW = FA + "call.how"
FA_RESOURCE = FA + "call.resource"
FA_POSITION = FA + "call.position"
FA_OUTCOME = FA + "call.outcome"
FA_REUSED = FA + "call.reused"
FA_IN_DOUBT = FA + "call.was_in_doubt"
FA_RECONCILED = FA + "call.reconciled"
FA_LATENCY_MS = FA + "call.latency_ms"
FA_MODELS_ASKED = FA + "call.models_asked"
FA_ORIGINAL_START_MS = FA + "call.original.start_ms"
FA_ORIGINAL_LATENCY_MS = FA + "call.original.latency_ms"
FA_REPLAY = FA + "replay"

#: Attributes whose values repeat from span to span, set by the agent's definition (an encoder may build each
#: value's encoding once): never a key, an id, a count, a time or content.
REPEATING = frozenset({
    GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, GEN_AI_AGENT_NAME, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOOL_NAME, GEN_AI_TOOL_TYPE, ERROR_TYPE, OI_SPAN_KIND, OI_LLM_MODEL_NAME, OI_LLM_PROVIDER, OI_TOOL_NAME,
    FA_AGENT, FA_LINEAGE, FA_JOB_ID, FA_ATTEMPT, FA_SUBTASK, FA_ACTION, FA_ACTION_HOW, FA_CALL_HOW, FA_RESOURCE,
    FA_POSITION, FA_OUTCOME, FA_REUSED, FA_IN_DOUBT, FA_RECONCILED, FA_REPLAY})
