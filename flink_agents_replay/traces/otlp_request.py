"""The body of an OTLP/HTTP export request for a batch of spans, built with OpenTelemetry's own protobuf messages.

The SDK's exporter takes ``ReadableSpan`` s and encodes every attribute of every span anew, in Python
(``encode_spans``). For the five-odd spans a run makes, that was most of the exporter process's CPU, which it takes
from the TaskManager's machine. :class:`RequestEncoder` builds the same ``ExportTraceServiceRequest`` from
:class:`~.spans.SpanData` (``tests/unit/test_otlp_request.py`` compares the two), in place, and builds each attribute
whose values repeat from span to span (:data:`~.conventions.REPEATING`: an operation, a span kind, a model, a tool)
once. As in the SDK, an attribute whose value cannot be encoded is left out (logged), not the request.

The request is sent by the SDK exporter's own HTTP client (:func:`sender`), so its configuration
(``OTEL_EXPORTER_OTLP_*``), compression, retries and timeout apply. That client is not public API: it is used only
on the exporter versions it was checked on (:data:`CHECKED_VERSIONS`); elsewhere the spans go through the exporter's
public ``export``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, SpanFlags, Status

from flink_agents_replay.traces.conventions import REPEATING
from flink_agents_replay.traces.spans import SpanData

__all__ = ["CHECKED_VERSIONS", "RequestEncoder", "sender"]

log = logging.getLogger(__name__)

#: ``opentelemetry-exporter-otlp-proto-http`` versions (major.minor) whose exporter's HTTP client :func:`sender` uses.
CHECKED_VERSIONS = ("1.45",)
#: Repeating attributes kept, at most (their values come from the agent's definition: a handful).
_KEPT = 4096
_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INTERNAL, _ERROR = Span.SpanKind.SPAN_KIND_INTERNAL, Status.STATUS_CODE_ERROR  # looked up once: enum lookups are slow


class RequestEncoder:
    """Requests of spans of one resource and instrumentation scope."""

    def __init__(self, resource: Mapping[str, Any], *, scope: str, version: str, schema_url: str,
                 resource_schema_url: str = "") -> None:
        self._kept: dict[tuple[str, type, Any], KeyValue] = {}
        self._resource = Resource(attributes=[_key_value(key, value) for key, value in resource.items()])
        self._resource_schema_url = resource_schema_url
        self._scope = InstrumentationScope(name=scope, version=version, attributes=[])
        self._schema_url = schema_url

    def encode(self, spans: Iterable[SpanData]) -> bytes:
        """The serialized ``ExportTraceServiceRequest`` of ``spans``. Each span is built in place, in the request
        (a message built apart is copied whole into its parent)."""
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add(schema_url=self._resource_schema_url)
        resource_spans.resource.CopyFrom(self._resource)
        scope_spans = resource_spans.scope_spans.add(schema_url=self._schema_url)
        scope_spans.scope.CopyFrom(self._scope)
        add = scope_spans.spans.add
        for span in spans:
            self._fill(add(trace_id=span.trace_id.to_bytes(16, "big"), span_id=span.span_id.to_bytes(8, "big"),
                           parent_span_id=None if span.parent_id is None else span.parent_id.to_bytes(8, "big"),
                           name=span.name, kind=_INTERNAL, start_time_unix_nano=span.start_ns,
                           end_time_unix_nano=max(span.end_ns, span.start_ns), flags=_HAS_IS_REMOTE), span)
        return request.SerializePartialToString()

    def _fill(self, message: Span, span: SpanData) -> None:
        """Its attributes, links and status."""
        attributes = message.attributes
        for key, value in span.attributes.items():
            try:
                if key in REPEATING:
                    attributes.append(self._kept_attribute(key, value))
                else:
                    _set_value(attributes.add(key=key).value, value)
            except (TypeError, ValueError, OverflowError):
                if attributes and attributes[-1].key == key:
                    del attributes[-1]
                log.warning("span %r: attribute %r of type %s left out: it cannot be encoded", span.name, key,
                            type(value).__name__)
        for trace, linked in span.links:
            message.links.add(trace_id=trace.to_bytes(16, "big"), span_id=linked.to_bytes(8, "big"),
                              flags=_HAS_IS_REMOTE | _IS_REMOTE)
        if span.error is not None:
            message.status.code = _ERROR
            message.status.message = span.error
        else:
            message.status.SetInParent()  # UNSET, present: as the SDK sends it

    def _kept_attribute(self, key: str, value: Any) -> KeyValue:
        if not isinstance(value, (str, bool, int, float)):
            return _key_value(key, value)
        kept = (key, type(value), value)
        attribute = self._kept.get(kept)
        if attribute is None:
            attribute = _key_value(key, value)
            if len(self._kept) < _KEPT:
                self._kept[kept] = attribute
        return attribute


def _set_value(message: AnyValue, value: Any) -> None:
    """Common values set in place; the rest as the SDK's encoder reads them (:func:`_any_value`)."""
    if isinstance(value, bool):
        message.bool_value = value
    elif isinstance(value, str):
        message.string_value = value
    elif isinstance(value, int):
        message.int_value = value
    elif isinstance(value, float):
        message.double_value = value
    else:
        message.CopyFrom(_any_value(value))


def _key_value(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=_any_value(value))


def _any_value(value: Any) -> AnyValue:
    """As the SDK's encoder reads an attribute's value (bool before int: a bool is an int)."""
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[_any_value(item) for item in value]))
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(values=[_key_value(str(k), v) for k, v in value.items()]))
    raise TypeError(f"a span attribute of type {type(value).__name__}")


def sender(exporter: Any) -> Callable[[bytes], bool] | None:
    """How to send an encoded request with the SDK exporter's own HTTP client (``True``: delivered), or ``None``:
    another exporter, or an exporter version not in :data:`CHECKED_VERSIONS`."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.exporter.otlp.proto.http.version import __version__ as exporter_version
    except ImportError:  # another exporter, without the OTLP/HTTP one installed
        return None
    client = getattr(exporter, "_client", None)
    if (type(exporter) is not OTLPSpanExporter or not callable(getattr(client, "export", None))
            or ".".join(exporter_version.split(".")[:2]) not in CHECKED_VERSIONS):
        log.debug("spans are encoded by the exporter (%s %s)", type(exporter).__name__, exporter_version)
        return None
    largest = getattr(exporter, "_max_request_size", 0) or 0

    def send(body: bytes) -> bool:
        # What the exporter's own export checks around its client: shut down, or a request over its size limit.
        if getattr(exporter, "_shutdown", False):
            return False
        if largest > 0 and len(body) > largest:
            log.warning("a request of %d bytes is over the exporter's limit (%d); its spans are dropped", len(body),
                        largest)
            return False
        return getattr(client.export(body), "success", None) is True

    return send
