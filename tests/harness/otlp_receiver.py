"""An OTLP/HTTP trace receiver in the test's process: every span it was sent, as protobuf spans, and with each the
attributes of the resource it came with (``service.name``...).

It answers every export at once (or, ``down``, with 503, as a collector that is unavailable); a real receiver
with a UI is Phoenix (``phoenix`` in tests/conftest.py).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["Receiver"]


def _plain(value: AnyValue):
    """An OTLP attribute value as a Python value (strings, numbers, booleans; other kinds as their protobuf)."""
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


class Receiver:
    """An OTLP/HTTP trace receiver in this process: every span it was sent, as protobuf spans (:attr:`spans`), and
    each with its resource's attributes as a dict (:attr:`resourced`: ``(attributes, span)``, in the same order)."""

    def __init__(self):
        self.spans: list = []
        self.resourced: list[tuple[dict[str, Any], Any]] = []
        self.down = False
        lock = self.lock = threading.Lock()
        spans, resourced = self.spans, self.resourced
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for batch in request.resource_spans:
                        attributes = {attribute.key: _plain(attribute.value)
                                      for attribute in batch.resource.attributes}
                        for scope in batch.scope_spans:
                            spans.extend(scope.spans)
                            resourced.extend((attributes, span) for span in scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def services(self, span_name: str) -> dict[str, set[str]]:
        """The trace ids (hex) of the spans named ``span_name``, per the ``service.name`` of their resource."""
        with self.lock:
            found: dict[str, set[str]] = {}
            for attributes, span in self.resourced:
                if span.name == span_name:
                    found.setdefault(attributes.get("service.name"), set()).add(span.trace_id.hex())
            return found

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


