"""The stub model and order-lookup service: deterministic replies, counts, idempotency, its process and CLI."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest

from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.local.errors import LocalServiceError
from flink_agents_replay.local.model_server import (
    LocalModelServer,
    ServerStats,
    StubModelServer,
    fetch_stats,
    reset_stats,
)
from flink_agents_replay.local.processes import pid_alive
from flink_agents_replay.resources import ChatModel


@pytest.fixture
def server():
    with StubModelServer() as running:
        yield running


def _request(url: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _chat(server: StubModelServer, text: str, headers: dict[str, str] | None = None, **extra) -> tuple[int, bytes]:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": text}], **extra}
    return _request(server.base_url + "/chat/completions", body, headers)


def _wait_until(condition, what: str, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` until it holds (a condition wait, not a guessed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def _reply(server: StubModelServer, text: str) -> str:
    status, body = _chat(server, text)
    assert status == 200, body
    return json.loads(body)["choices"][0]["message"]["content"]


# --- replies ------------------------------------------------------------------------------------------------


def test_same_request_gives_byte_equal_reply_in_openai_format(server):
    first = _chat(server, "My order 1234 has not arrived.", temperature=0.2)
    second = _chat(server, "My order 1234 has not arrived.", temperature=0.2)
    assert first == second and first[0] == 200
    reply = json.loads(first[1])
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    assert reply["model"] == "stub-model" and isinstance(reply["created"], int)
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["prompt_tokens"] == 6
    assert reply["usage"]["total_tokens"] == 6 + reply["usage"]["completion_tokens"]
    assert _chat(server, "My order 1235 has not arrived.", temperature=0.2)[1] != first[1]


def test_category_is_the_first_listed_name_found_as_a_whole_word(server):
    ask = "Classify the ticket.\nCategories: billing, shipping, technical\nTicket: {}"
    assert _reply(server, ask.format("My parcel is late, what about SHIPPING?")) == "shipping"
    # Listed order decides, not the order in the text.
    assert _reply(server, ask.format("technical trouble with my billing page")) == "billing"
    # Whole words only: "rebilling" and "technicalities" do not count.
    assert _reply(server, ask.format("rebilling technicalities; technical")) == "technical"
    # The Categories line itself names every category, and must not count.
    text = ask.format("nothing relevant here")
    names = ["billing", "shipping", "technical"]
    assert _reply(server, text) == names[int(hashlib.sha256(text.encode()).hexdigest(), 16) % 3]


def test_category_fallback_only_picks_listed_names_and_spreads(server):
    replies = {_reply(server, f"categories:  Alpha , Beta,Gamma.\nticket number {i}") for i in range(40)}
    assert replies == {"Alpha", "Beta", "Gamma"}


def test_category_comes_from_the_last_user_message(server):
    messages = [
        {"role": "system", "content": "Categories: system-only"},
        {"role": "user", "content": "Categories: a, b\nabout a"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "Categories: x, y\nthis is about y"}]},
    ]
    status, body = _request(server.base_url + "/chat/completions", {"model": "m", "messages": messages})
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "y"
    assert json.loads(body)["model"] == "m"


def test_drafts_are_deterministic_and_differ_across_inputs(server):
    drafts = [_reply(server, f"Please help with ticket {i}: the app crashes.") for i in range(20)]
    assert all(d.startswith("Thank you for reaching out. ") and "(ref " in d for d in drafts)
    assert len(set(drafts)) == 20
    assert _reply(server, "Please help with ticket 3: the app crashes.") == drafts[3]


def test_chat_model_resource_works_against_it(server):
    model = ChatModel("stub-model", base_url=server.base_url)
    assert model.invoke(prompt="Categories: refund, other\nI want a refund") == "refund"
    assert model.invoke(prompt="Write a reply").startswith("Thank you for reaching out.")
    assert server.stats().chat == 2


def test_bad_requests_are_400_in_openai_format_and_not_executed(server):
    url = server.base_url + "/chat/completions"
    for body in (b"{not json", b"[]", b'{"model": "m"}', b'{"model": "m", "messages": []}',
                 b'{"model": "m", "messages": [{"content": "no role"}]}'):
        status, reply = _request(url, body)
        assert status == 400, body
        assert json.loads(reply)["error"]["type"] == "invalid_request_error"
    assert _chat(server, "hi", headers={"X-Stub-Delay-Ms": "soon"})[0] == 400
    assert server.stats() == ServerStats()


def test_models_lists_the_stub_model(server):
    status, body = _request(server.base_url + "/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["stub-model"]


def test_orders_are_deterministic_and_empty_id_is_404(server):
    first = _request(server.url + "/orders/A-1001")
    assert first == _request(server.url + "/orders/A-1001") and first[0] == 200
    order = json.loads(first[1])
    assert order["order_id"] == "A-1001"
    assert order["status"] in ("processing", "shipped", "delivered", "returned")
    assert 1 <= order["items"] <= 5 and isinstance(order["total"], float) and order["carrier"]
    others = [json.loads(_request(server.url + f"/orders/A-{i}")[1]) for i in range(30)]
    assert len({o["status"] for o in others}) > 1
    assert _request(server.url + "/orders/")[0] == 404
    assert _request(server.url + "/orders")[0] == 404
    assert server.stats().orders == 32


# --- counts and idempotency --------------------------------------------------------------------------------


def test_counts_executions_repeats_and_distinct(server):
    _chat(server, "one")
    _chat(server, "two")
    _chat(server, "one")
    _request(server.url + "/orders/7")
    _request(server.url + "/orders/7")
    # The same text with a different parameter is a different question.
    _chat(server, "one", temperature=1.0)
    stats = server.stats()
    assert stats == ServerStats(chat=4, orders=2, in_flight=0, repeated=2, idempotent_replays=0, distinct=4)
    assert stats.executions == 6
    assert fetch_stats(server.base_url) == stats
    assert reset_stats(server.url) == ServerStats()
    _chat(server, "one")
    assert server.stats() == ServerStats(chat=1, distinct=1)


def test_same_idempotency_key_is_replayed_not_executed(server):
    headers = {"Idempotency-Key": "ticket-1/draft"}
    first = _chat(server, "Draft a reply", headers)
    second = _chat(server, "Draft a reply", headers)
    assert first == second
    assert server.stats() == ServerStats(chat=1, idempotent_replays=1, distinct=1)
    # The key is per endpoint; without a key a request always executes (and counts as repeated).
    _request(server.url + "/orders/ticket-1", headers=headers)
    _chat(server, "Draft a reply")
    assert server.stats() == ServerStats(chat=2, orders=1, repeated=1, idempotent_replays=1, distinct=2)


def test_concurrent_requests_with_one_key_execute_once(server):
    headers = {"Idempotency-Key": "k-1", "X-Stub-Delay-Ms": "1500"}
    results: list[tuple[int, bytes]] = []
    first_done: list[float] = []

    def first() -> None:
        results.append(_chat(server, "slow question", headers))
        first_done.append(time.monotonic())

    leader = threading.Thread(target=first)
    leader.start()
    _wait_until(lambda: server.stats().in_flight == 1, "the first request is executing")
    followers_sent = time.monotonic()
    followers = [threading.Thread(target=lambda: results.append(_chat(server, "slow question", headers)))
                 for _ in range(4)]
    for thread in followers:
        thread.start()
    for thread in [leader, *followers]:
        thread.join(timeout=30)
    assert followers_sent < first_done[0], "the followers must arrive while the first request is under way"
    assert len(results) == 5 and len(set(results)) == 1 and results[0][0] == 200
    assert server.stats() == ServerStats(chat=1, idempotent_replays=4, distinct=1)


def test_in_flight_counts_executions_under_way(server):
    thread = threading.Thread(target=_chat, args=(server, "slow", {"X-Stub-Delay-Ms": "1000"}))
    thread.start()
    _wait_until(lambda: server.stats().in_flight == 1, "the request is executing")
    assert server.stats().chat == 1
    thread.join(timeout=30)
    assert server.stats().in_flight == 0



def test_a_caller_gone_before_its_reply_is_one_log_line_not_a_traceback(server, capsys, caplog):
    """A killed TaskManager leaves its request behind: the reply's write fails, and the demo's terminal shows
    one line of it, not the socket server's traceback."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "gone"}]}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"X-Stub-Delay-Ms: 300\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    caplog.set_level(logging.INFO, logger="flink_agents_replay.local.model_server")
    client = socket.create_connection(("127.0.0.1", server.port))
    client.sendall(request)
    _wait_until(lambda: server.stats().in_flight == 1, "the request is executing")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    client.close()
    _wait_until(lambda: any("went away" in r.getMessage() for r in caplog.records), "the reply's failed write")
    assert [r.getMessage() for r in caplog.records if "went away" in r.getMessage()] == [
        "the client of POST /v1/chat/completions went away before its reply"]
    assert "Traceback" not in capsys.readouterr().err
    assert _chat(server, "still serving")  # the server goes on

# --- delay --------------------------------------------------------------------------------------------------


def test_delay_header_is_honoured(server):
    fast = _chat(server, "hi")
    started = time.monotonic()
    slow = _chat(server, "hi", {"X-Stub-Delay-Ms": "1100"})
    assert time.monotonic() - started >= 1.1
    # Neither the delay nor the clock (a second later now) is part of the reply.
    assert slow == fast
    started = time.monotonic()
    assert _request(server.url + "/orders/9", headers={"X-Stub-Delay-Ms": "200"})[0] == 200
    assert time.monotonic() - started >= 0.2


def test_constructor_delay_applies_and_the_header_overrides_it():
    with StubModelServer(delay_ms=600) as slow:
        started = time.monotonic()
        _chat(slow, "hi")
        assert time.monotonic() - started >= 0.6
        started = time.monotonic()
        _chat(slow, "hi", {"X-Stub-Delay-Ms": "0"})
        assert time.monotonic() - started < 0.6


def test_taken_port_is_a_local_service_error(server):
    with pytest.raises(LocalServiceError, match="another port"):
        StubModelServer(port=server.port).start()


# --- as a process and from the CLI -------------------------------------------------------------------------


def test_local_model_server_lifecycle(tmp_path):
    service = LocalModelServer(tmp_path / "model", port=0)
    assert not service.status().running and service.status().base_url is None
    status = service.start()
    try:
        assert status.running and status.base_url == f"http://127.0.0.1:{status.port}/v1"
        assert status.base_url in status.describe()
        assert service.start() == status  # already running: the same one
        model = ChatModel("stub-model", base_url=status.base_url)
        assert model.invoke(prompt="hello") == model.invoke(prompt="hello")
        assert fetch_stats(status.base_url) == ServerStats(chat=2, repeated=1, distinct=1)
        assert (tmp_path / "model" / "model-server.log").is_file()
    finally:
        assert service.stop()
    assert not pid_alive(status.pid)
    assert not service.status().running
    assert not service.stop()


def test_local_model_server_on_a_taken_port(server, tmp_path):
    with pytest.raises(LocalServiceError, match=f"port {server.port} .* already in use"):
        LocalModelServer(tmp_path, port=server.port).start()
    assert not LocalModelServer(tmp_path).status().running


def test_cli_model_status_stop_and_start(tmp_path, capsys):
    work_dir = str(tmp_path / "model")
    assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 3
    assert "not running" in capsys.readouterr().out
    assert cli_main(["local", "model", "start", "--port", "0", "--delay-ms", "5", "--work-dir", work_dir]) == 0
    try:
        out = capsys.readouterr().out
        assert out.startswith("running: pid ")
        export = [line for line in out.splitlines() if line.startswith("export OPENAI_BASE_URL=")]
        base_url = export[0].split("=", 1)[1]
        assert ChatModel("stub-model", base_url=base_url).invoke(prompt="Categories: a, b\nb") == "b"
        assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 0
    finally:
        assert cli_main(["local", "model", "stop", "--work-dir", work_dir]) == 0
    assert "stopped" in capsys.readouterr().out
    assert cli_main(["local", "model", "status", "--work-dir", work_dir]) == 3


def test_chat_model_retries_a_transient_failure_and_then_names_the_endpoint():
    from flink_agents_replay.local.processes import free_port
    from flink_agents_replay.resources import ChatModelError

    nobody = f"http://127.0.0.1:{free_port()}/v1"
    begun = time.monotonic()
    with pytest.raises(ChatModelError, match=f"could not reach {nobody}/chat/completions"):
        ChatModel("stub-model", base_url=nobody, retries=2).invoke(prompt="hello")
    assert time.monotonic() - begun >= 0.25 + 0.5  # two pauses: it did try again
