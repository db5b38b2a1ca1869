"""The delaying TCP proxy of the slow-broker test: replies arrive late, in order, requests at once."""

from __future__ import annotations

import socket
import threading
import time

from flink_agents_replay.testing.delay_proxy import DelayProxy


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=connection: [c.sendall(d) for d in iter(lambda: c.recv(1024), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        started = time.monotonic()
        client.sendall(payload)
        received = b""
        while len(received) < len(payload):
            received += client.recv(1024)
        return received, time.monotonic() - started


def test_replies_arrive_delayed_and_in_order_and_the_delay_can_change():
    server, port = _echo_server()
    try:
        with DelayProxy(upstream_port=port, delay_s=0.3) as proxy:
            echoed, took = _round_trip(proxy.port, b"0123456789" * 50)
            assert echoed == b"0123456789" * 50 and took >= 0.3  # lower bounds only: a busy machine adds time
            assert proxy.bytes_delayed == 500
            proxy.delay_s = 0.8
            assert _round_trip(proxy.port, b"x")[1] >= 0.8
    finally:
        server.close()


def test_a_server_that_is_down_refuses_through_the_proxy_too():
    from flink_agents_replay.local.processes import free_port

    with DelayProxy(upstream_port=free_port()) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as client:
        client.settimeout(5)
        assert client.recv(10) == b""  # closed at once: not a hang
