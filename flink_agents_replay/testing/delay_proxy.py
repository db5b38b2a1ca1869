"""A TCP proxy on loopback that delays what a server sends back: a slow broker, for tests.

``DelayProxy(upstream_port=9092, delay_s=0.2)`` listens on 127.0.0.1 and forwards every connection to the
upstream port. What the client sends goes through at once; what the server answers reaches the client
``delay_s`` later (each chunk, in order): every Kafka response, acknowledgements included, arrives late,
as from an overloaded broker or a long network path. ``delay_s`` can be changed while it runs.

Kafka clients connect to the address the broker *advertises*, not the bootstrap one, so the broker must
advertise the proxy's port (``LocalKafkaBroker(advertised_port=proxy.port)``, :mod:`..local.kafka_broker`).

Threads, not asyncio: two per connection and one for accepting, plain blocking sockets, few connections.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from flink_agents_replay.local.processes import free_port

__all__ = ["DelayProxy"]

_CHUNK = 65536


class DelayProxy:
    """Forward 127.0.0.1:``port`` to 127.0.0.1:``upstream_port``, delaying the upstream's replies ``delay_s``.

    Args:
        upstream_port: the server's port.
        delay_s: how late each chunk the server sends reaches the client.
        port: where the proxy listens (default: a free port, chosen now so a broker can advertise it first).
    """

    def __init__(self, *, upstream_port: int, delay_s: float = 0.0, port: int | None = None):
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.port = port or free_port()
        self.bytes_delayed = 0  # replies forwarded late (a test proves the proxy was in the path)
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self) -> DelayProxy:
        """Listen and serve in background threads."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept_loop, name=f"delay-proxy-{self.port}", daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listener and every connection."""
        self._stopped.set()
        with self._lock:
            sockets, self._sockets = [*self._sockets, *([self._listener] if self._listener else [])], []
        for sock in sockets:
            _close(sock)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)  # the server is down: the client sees a refused connection, as without the proxy
                continue
            with self._lock:
                self._sockets += [client, upstream]
            replies: queue.Queue = queue.Queue()
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, replies), daemon=True).start()
            threading.Thread(target=self._deliver_late, args=(replies, client, upstream), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, late: queue.Queue | None) -> None:
        """Copy ``source`` to ``target`` at once, or (``late``) queue each chunk with the time it is due."""
        try:
            while chunk := source.recv(_CHUNK):
                if late is None:
                    target.sendall(chunk)
                else:
                    late.put((time.monotonic() + self.delay_s, chunk))
        except OSError:
            pass
        if late is not None:
            late.put((0.0, b""))  # the end, after what is queued
        else:
            _close(source, target)

    def _deliver_late(self, replies: queue.Queue, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                due, chunk = replies.get()
                if not chunk:
                    break
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # the injected delay itself
                self.bytes_delayed += len(chunk)  # before sending: a test reads it once the reply arrived
                client.sendall(chunk)
        except OSError:
            pass
        _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.close()
        except OSError:
            pass
