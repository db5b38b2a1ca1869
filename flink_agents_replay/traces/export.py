"""Sending spans: the package's own tracer provider, a queue, and one thread that builds and exports in batches.

A run hands over what it did (a function that makes its spans) and goes on: the spans are made and exported on the
exporter's thread, never on a run's or the task's. The queue is bounded (``max_queued_spans``); what does not fit is
dropped and counted, and so is every span of a batch the exporter could not deliver (a collector that is down), so
an outage never slows or fails a run: ``dropped`` tells how much was lost. :meth:`SpanSink.flush` waits, at most
``flush_timeout_s``, until what was handed over has left: the operator calls it at each checkpoint, so that the
spans of runs applied before the checkpoint are out before it completes (runs applied after it are executed again
after a failure, and their spans made again from their journaled records).

The provider is this package's, never the global one: other libraries' spans (chromadb-client's, say) are not
exported by it, and its spans do not go through an application's provider. Spans carry the ids :mod:`.ids` derived,
so a span made again after a failure is the same span. The exporter is the OpenTelemetry SDK's
OTLP/HTTP one, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables unless the settings name an endpoint.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable

import pydantic

from flink_agents_replay import __version__ as PACKAGE_VERSION
from flink_agents_replay.traces.conventions import OI_PROJECT_NAME, SCHEMA_URL
from flink_agents_replay.traces.spans import SpanData

__all__ = ["SpanSink", "TracingConfig"]

log = logging.getLogger(__name__)

#: Spans sent in one export request, and how long spans wait for more before they are sent: the batch span
#: processor's settings (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, ``OTEL_BSP_SCHEDULE_DELAY`` in ms). A request per run cost
#: more than encoding the run's spans; the delay is shorter than the SDK's 5 s because a checkpoint waits for what
#: is pending (a flush sends at once).
_BATCH_DEFAULT, _DELAY_MS_DEFAULT = 512, 200


class TracingConfig(pydantic.BaseModel):
    """Where a job's spans go and what they hold (``AgentConfig(tracing=TracingConfig(...))``, or ``tracing=True``
    for the defaults).

    Attributes:
        service_name: the spans' ``service.name``, which is also their Phoenix project; default
            ``$OTEL_SERVICE_NAME``, else the agent's name (a replay adds ``-replay``).
        endpoint: the OTLP/HTTP base URL (``http://collector:4318``); default ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
            or ``$OTEL_EXPORTER_OTLP_ENDPOINT``, read where the job runs, as the OpenTelemetry SDK reads them.
        headers: sent with every export (default ``$OTEL_EXPORTER_OTLP_HEADERS``).
        capture_content: put prompts, replies, tool arguments and results, inputs and outputs into spans. Off
            unless set, or ``$OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``.
        export_timeout_s: how long one export request may take before its spans count as dropped.
        flush_timeout_s: how long a checkpoint waits for the spans of the runs applied before it to leave.
        max_queued_spans: spans waiting for export per subtask; more are dropped and counted (``spans_dropped``).
        resource_attributes: more resource attributes for every span (``OTEL_RESOURCE_ATTRIBUTES`` applies too).
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    service_name: str | None = None
    endpoint: str | None = None
    headers: dict[str, str] | None = pydantic.Field(default=None, repr=False)
    capture_content: bool | None = None
    # Bounded: a checkpoint and a closing operator wait for them (an infinite wait held a failover's slots for good).
    export_timeout_s: float = pydantic.Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    flush_timeout_s: float = pydantic.Field(default=5.0, ge=0, le=600, allow_inf_nan=False)
    max_queued_spans: int = pydantic.Field(default=20_000, ge=1)
    resource_attributes: dict[str, str] = pydantic.Field(default_factory=dict)

    @pydantic.field_validator("endpoint")
    @classmethod
    def _an_http_url(cls, endpoint: str | None) -> str | None:
        if endpoint is None:
            return None
        parsed = urllib.parse.urlsplit(endpoint)
        try:
            parsed.port  # noqa: B018 - read for its check: a port out of range raises
        except ValueError:
            parsed = None
        if (parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname
                or any(ch.isspace() for ch in endpoint)):
            raise ValueError("the OTLP/HTTP endpoint must be an http:// or https:// URL with a host (and a port "
                             "up to 65535), such as http://collector:4318")
        return endpoint

    @pydantic.field_validator("headers")
    @classmethod
    def _one_line_each(cls, headers: dict[str, str] | None) -> dict[str, str] | None:
        if headers and any(ch in "\r\n" for item in headers.items() for text in item for ch in text):
            raise ValueError("a header name or value holds a line break")
        return headers

    def content(self) -> bool:
        """Whether spans carry prompts and replies."""
        if self.capture_content is not None:
            return self.capture_content
        return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() == "true"

    def service(self, agent: str) -> str:
        return self.service_name or os.environ.get("OTEL_SERVICE_NAME") or agent


class SpanSink:
    """Spans of runs, made and exported on a thread of their own (see the module's docstring).

    ``exporter``: an OpenTelemetry ``SpanExporter`` (default: OTLP/HTTP from the settings and the environment).
    """

    def __init__(self, settings: TracingConfig, *, agent: str, exporter=None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from flink_agents_replay.traces.otlp_request import RequestEncoder, sender

        self.settings = settings
        service = settings.service(agent)
        resource = Resource.create({"service.name": service, OI_PROJECT_NAME: service,
                                    **settings.resource_attributes})
        resource = _hashed_once()(resource.attributes, resource.schema_url)
        self._provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # the package's own, never global
        self._scope = InstrumentationScope("flink_agents_replay", PACKAGE_VERSION, SCHEMA_URL)
        self._exporter = exporter if exporter is not None else _otlp_exporter(settings)
        self._send = sender(self._exporter)  # None: the exporter encodes (another exporter, an unchecked version)
        self._encoder = RequestEncoder(resource.attributes, scope=self._scope.name, version=PACKAGE_VERSION,
                                       schema_url=SCHEMA_URL, resource_schema_url=resource.schema_url)
        self._pending: deque[tuple[int, Callable[[], list[SpanData]]]] = deque()
        self._queued = 0  # spans waiting, by the estimates handed in
        self._busy = False
        self._closing = False  # close() began: what is pending is sent at once
        self._closed = False  # close() ended: nothing more is taken
        self._flushes = 0  # flushes waiting: the exporter sends what it holds without waiting for a full batch
        self._batch, self._delay_s = _batching()
        self._lock = threading.Condition()
        self.exported = 0
        self.dropped = 0
        self.collector_down = False  # the last export failed: a flush does not wait until one succeeds again
        self._thread = threading.Thread(target=self._work, name="flink-agents-replay-spans", daemon=True)
        self._thread.start()

    def submit(self, make: Callable[[], list[SpanData]], estimate: int) -> None:
        """Have the spans ``make`` returns exported (about ``estimate`` of them); never blocks."""
        with self._lock:
            if self._closed or self._queued + estimate > self.settings.max_queued_spans:
                self.dropped += estimate
                return
            self._pending.append((estimate, make))
            self._queued += estimate
            if len(self._pending) == 1 or self._queued >= self._batch:  # else the exporter gathers unwoken
                self._lock.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything handed over so far has been exported or dropped; ``False`` if it took longer than
        ``timeout_s`` (default: the settings' ``flush_timeout_s``), or at once while the collector is down (the last
        export failed: each failed export takes the exporter's retries, and a checkpoint must not wait for them)."""
        timeout = self.settings.flush_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._flushes += 1
            self._lock.notify_all()
            try:
                return self._lock.wait_for(
                    lambda: self.collector_down or (not self._pending and not self._busy), timeout) and not (
                    self._pending or self._busy)
            finally:
                self._flushes -= 1

    def close(self) -> None:
        """Export what is queued, then stop the thread and the exporter. The exporter sends what it holds at once,
        also to a collector found down (it may be back); what is still queued after the flush and export timeouts
        is dropped, counted. Nothing waits for this close but the exporter process's own end."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            self._lock.wait_for(lambda: not self._pending and not self._busy,
                                self.settings.flush_timeout_s + self.settings.export_timeout_s)
            self._closed = True
            left = sum(estimate for estimate, _ in self._pending)  # a batch under way counts itself
            self.dropped += left
            self._queued -= left
            self._pending.clear()
            self._lock.notify_all()
        self._thread.join(self.settings.export_timeout_s + 1)
        self._exporter.shutdown()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending or self._closed)
                self._lock.wait_for(lambda: self._closing or self._flushes or self._queued >= self._batch,
                                    self._delay_s)
                if self._closed:
                    return
                taken = list(self._pending)
                self._pending.clear()
                self._busy = True
            try:
                self._export([span for _, make in taken for span in self._made(make)])
            except Exception:  # noqa: BLE001 - the thread must live on; what it held is lost, and counted
                log.exception("spans could not be exported; they are dropped")
                with self._lock:
                    self.dropped += sum(estimate for estimate, _ in taken)
            finally:
                with self._lock:
                    self._queued -= sum(estimate for estimate, _ in taken)
                    self._busy = False
                    self._lock.notify_all()

    def _made(self, make: Callable[[], list[SpanData]]) -> list[SpanData]:
        try:
            return make()
        except Exception:  # noqa: BLE001 - a trace must never fail a job; say what broke
            log.exception("the spans of a run could not be made; they are dropped")
            with self._lock:
                self.dropped += 1
            return []

    def _export(self, spans: list[SpanData]) -> None:
        for start in range(0, len(spans), self._batch):
            batch = spans[start:start + self._batch]
            try:
                delivered = self._delivered(batch)
            except Exception:  # noqa: BLE001 - an exporter that raises is a failed export
                log.exception("exporting %d spans failed", len(batch))
                delivered = False
            with self._lock:
                self.collector_down = not delivered
                if not self.collector_down:
                    self.exported += len(batch)
                    continue
                self.dropped += len(batch)
                self._lock.notify_all()  # a flush waiting for this batch stops waiting
            log.warning("%d spans were not delivered (the trace collector did not take them); dropped",
                            len(batch))

    def _delivered(self, batch: list[SpanData]) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._send is not None:
            return self._send(self._encoder.encode(batch))
        return self._exporter.export([self._readable(span) for span in batch]) is SpanExportResult.SUCCESS

    def _readable(self, span: SpanData):
        """The SDK span of ``span``, with the derived ids, the provider's resource and the package's scope. Made as a
        ``ReadableSpan`` directly: a tracer's ``start_span`` and ``end`` cost 70 us a span more (sampling, context,
        attribute copies), for spans that are ended and sampled by construction."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

        sampled = TraceFlags(TraceFlags.SAMPLED)
        return ReadableSpan(
            name=span.name, context=SpanContext(span.trace_id, span.span_id, is_remote=False, trace_flags=sampled),
            parent=None if span.parent_id is None else SpanContext(span.trace_id, span.parent_id, is_remote=False,
                                                                     trace_flags=sampled),
            resource=self._provider.resource, attributes=span.attributes,
            links=[Link(SpanContext(upstream, linked, is_remote=True, trace_flags=sampled))
                   for upstream, linked in span.links],
            status=Status(StatusCode.ERROR, span.error) if span.error is not None else Status(StatusCode.UNSET),
            start_time=span.start_ns, end_time=max(span.end_ns, span.start_ns), instrumentation_scope=self._scope)


@functools.cache  # the class is made where OpenTelemetry is imported: the operator's side never imports it
def _hashed_once():
    from opentelemetry.sdk.resources import Resource

    class HashedOnce(Resource):
        """A resource whose hash is computed once: the OTLP encoder groups each span by its resource, and a
        ``Resource`` hashes its attributes as JSON at every lookup (a tenth of the encoding's cost)."""

        def __init__(self, attributes, schema_url=None):
            super().__init__(attributes, schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    return HashedOnce


def _batching() -> tuple[int, float]:
    """(spans per request, seconds spans wait for more) from the batch span processor's variables."""
    def setting(name: str, default: int) -> int:
        try:
            value = int(os.environ.get(name, default))
        except ValueError:
            log.warning("%s is not a whole number; %d is used", name, default)
            return default
        return value if value > 0 else default

    return setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _BATCH_DEFAULT), setting(
        "OTEL_BSP_SCHEDULE_DELAY", _DELAY_MS_DEFAULT) / 1000


def _otlp_exporter(settings: TracingConfig):
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        from flink_agents_replay.core.errors import ConfigError

        raise ConfigError("tracing needs the OpenTelemetry OTLP exporter: pip install 'flink-agents-replay[tracing]'"
                          ) from exc
    endpoint = settings.endpoint
    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
    return OTLPSpanExporter(endpoint=endpoint, headers=settings.headers, timeout=settings.export_timeout_s)
