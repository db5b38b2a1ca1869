"""MCP tools against a real MCP server (local/mcp_orders_server.py), over stdio and streamable HTTP.

The server records every request it gets in SQLite, with the ``_meta`` idempotency key it carried and whether it
took effect, so executions are counted outside the process that calls the tools. Each test uses call ids of its
own, and counts by them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import cloudpickle
import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, OutputEvent, action
from flink_agents_replay.api.call_site import _CALL_SITE, CallSite
from flink_agents_replay.api.mcp_tools import McpServer, McpTool, mcp_tools, resource_names
from flink_agents_replay.api.resources import Resource
from flink_agents_replay.api.tool_loop import run_tool_loop
from flink_agents_replay.core.errors import (
    CallTimeoutError,
    ConfigError,
    McpConnectionError,
    McpProtocolError,
    McpToolError,
)
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.integrations.mcp_client import ATTEMPTS, BACKOFF_MIN_S, session_pool
from flink_agents_replay.local.mcp_orders_server import read_calls
from flink_agents_replay.local.model_replies import order_details
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.recovery import read_recovery_index
from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
from flink_agents_replay.storage.records.chat import ChatResult, ToolCall
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

SERVER_MODULE = "flink_agents_replay.local.mcp_orders_server"
KEY_GROUP = 3
SIGNING_KEY = b"mcp-tools-test-signing-key-0123"


def stdio_server(db, **env) -> McpServer:
    return McpServer(command=sys.executable, args=["-m", SERVER_MODULE, "--stdio", "--db", str(db)], env=env or None)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpServer:
    """The orders server as a process serving streamable HTTP on a port of its own; ``start`` waits until the port
    answers (polling), ``kill`` SIGKILLs it."""

    def __init__(self, db, port: int):
        self.db, self.port, self.process = db, port, None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpServer:
        self.process = subprocess.Popen([sys.executable, "-m", SERVER_MODULE, "--http", "--port", str(self.port),
                                         "--db", str(self.db)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the MCP server exited: {self.process.stderr.read().decode()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return self
            time.sleep(0.05)  # polling interval, not a wait standing in for readiness
        raise AssertionError(f"the MCP server did not listen on {self.port} within 30 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)
            self.process.stderr.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return tmp_path_factory.mktemp("mcp") / "orders.sqlite3"


@pytest.fixture(scope="module")
def http(db):
    server = HttpServer(db, free_port()).start()
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["stdio", "http"])
def server(request, db):
    server = stdio_server(db) if request.param == "stdio" else McpServer(url=request.getfixturevalue("http").url)
    session_pool().list_tools(server)  # a session kept open: listings reuse it (a stdio server starts in ~1 s)
    return server


@pytest.fixture(scope="module", autouse=True)
def sessions_closed():
    yield
    session_pool().close_sessions()  # no server process outlives the tests


@contextlib.contextmanager
def call_id(value: str):
    """Inside: ``current_call_id()`` is ``value``, as inside a journaled call."""
    token = _CALL_SITE.set(CallSite(call_id=value, stable_id=value, agent="a", resource="r", key_digest="k", seq=1,
                                    event_time_ms=None, epoch=1))
    try:
        yield value
    finally:
        _CALL_SITE.reset(token)


def unique(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:12]}"


def calls_with(db, key: str) -> list[dict]:
    return [call for call in read_calls(db) if call["idempotency_key"] == key]


# --- configuration ---------------------------------------------------------------------------------------------


def test_a_server_config_is_checked_and_its_identity_names_no_secrets():
    for bad, message in [({}, "either command= .* or url="), ({"command": "x", "url": "http://h/mcp"}, "not both"),
                         ({"url": "ftp://h/mcp"}, "http\\(s\\) URL"), ({"command": " "}, "executable"),
                         ({"command": "x", "args": "-m server"}, "list of strings"),
                         ({"command": "x", "env": {"A": 1}}, "map strings to strings"),
                         ({"command": "x", "headers": {"A": "b"}}, "headers= go with url="),
                         ({"url": "http://h/mcp", "cwd": "/tmp"}, "cwd go with command="),
                         ({"command": "x", "connect_timeout_s": 0}, "connect_timeout_s")]:
        with pytest.raises(ConfigError, match=message):
            McpServer(**bad)
    stdio = McpServer(command="srv", args=["--stdio"], env={"TOKEN": "secret", "A": "1"})
    assert stdio.identity() == {"transport": "stdio", "command": "srv", "args": ["--stdio"], "cwd": None,
                                "env": ["A", "TOKEN"]}
    assert McpServer(url="https://h/mcp", headers={"Authorization": "Bearer s"}).identity() == {
        "transport": "streamable-http", "url": "https://h/mcp", "headers": ["Authorization"]}
    assert "secret" not in json.dumps(stdio.identity())
    assert stdio == McpServer(command="srv", args=("--stdio",), env={"A": "1", "TOKEN": "secret"})  # the pool's key
    assert hash(stdio) == hash(McpServer(command="srv", args=("--stdio",), env={"A": "1", "TOKEN": "secret"}))


def test_resource_names_are_names_a_model_can_call():
    assert resource_names(["lookup", "refund"], prefix="orders_") == {"lookup": "orders_lookup",
                                                                      "refund": "orders_refund"}
    with pytest.raises(ConfigError, match=r"rename=\{'crm.lookup': 'crm_lookup'\}"):
        resource_names(["crm.lookup", "ok"])
    assert resource_names(["crm.lookup"], rename={"crm.lookup": "crm_lookup"}) == {"crm.lookup": "crm_lookup"}
    with pytest.raises(ConfigError, match="does not have"):
        resource_names(["a"], rename={"b": "c"})
    with pytest.raises(ConfigError, match="would both be named 'a'"):
        resource_names(["a", "b"], rename={"b": "a"})
    with pytest.raises(ConfigError, match="at most 64"):
        resource_names(["x" * 65])


# --- listing, calls, errors (stdio and HTTP) -------------------------------------------------------------------


def test_the_servers_tools_are_listed_with_their_schemas(server):
    tools = mcp_tools(server)
    assert sorted(tools) == ["issue_refund", "lookup_order", "tag_order"]
    refund = tools["issue_refund"]
    assert isinstance(refund, McpTool) and refund.mcp_name == "issue_refund" and refund.server == server
    assert refund.schema["required"] == ["order_id", "amount"]
    assert refund.schema["properties"]["amount"]["type"] == "number"
    shown = refund.openai_schema()
    assert shown["function"]["name"] == "issue_refund" and shown["function"]["description"].startswith("Refund")
    assert tools["lookup_order"].model_arguments({"order_id": "O-1"}) == {"order_id": "O-1"}  # as given


def test_a_call_goes_through_the_tool_with_the_call_id_in_meta(server, db):
    tool = mcp_tools(server)["lookup_order"]
    with call_id(unique("lookup")) as key:
        assert tool.invoke(order_id="O-12345") == order_details("O-12345")
    (call,) = calls_with(db, key)
    assert call["tool"] == "lookup_order" and call["arguments"] == {"order_id": "O-12345"} and call["executed"]


def test_an_error_result_raises_the_tools_error_with_its_text(server, db):
    tool = mcp_tools(server)["issue_refund"]
    with call_id(unique("refund")), pytest.raises(McpToolError, match="a refund must be a positive amount") as caught:
        tool.invoke(order_id="O-1", amount=-5)
    assert caught.value.tool == "issue_refund" and "-5" in caught.value.text
    again = pickle.loads(pickle.dumps(caught.value))  # journaled with its text
    assert (type(again), again.text, str(again)) == (McpToolError, caught.value.text, str(caught.value))
    with pytest.raises(TypeError, match="by name"):
        tool.invoke("O-1", 5)


def test_a_protocol_error_keeps_its_code_and_text():
    from mcp.shared.exceptions import McpError
    from mcp.types import ErrorData

    from flink_agents_replay.integrations.mcp_client import _Connection

    class Refusing:  # a session whose server answers tools/call with a JSON-RPC error
        async def call_tool(self, name, arguments, meta=None):
            raise McpError(ErrorData(code=-32602, message=f"Invalid params for {name}: amount"))

    pool, server = session_pool(), McpServer(url="http://127.0.0.1:9/refusing/mcp")
    connection = _Connection(server)
    connection.session = Refusing()
    pool._connections[server] = connection
    try:
        with pytest.raises(McpProtocolError, match=r"\(error -32602\): Invalid params for issue_refund") as caught:
            pool.call_tool(server, "issue_refund", {"order_id": "O-1", "amount": "x"}, idempotency_key="k")
    finally:
        pool._connections.pop(server)
    assert (caught.value.code, caught.value.text, caught.value.tool) == (
        -32602, "Invalid params for issue_refund: amount", "issue_refund")
    again = pickle.loads(pickle.dumps(caught.value))  # journaled with its code and text
    assert (type(again), again.code, again.text, str(again)) == (McpProtocolError, -32602, caught.value.text,
                                                                 str(caught.value))


def test_without_the_extra_the_package_works_and_mcp_tools_say_what_to_install():
    script = (
        "import sys\n"
        "sys.modules['mcp'] = None  # as if not installed\n"
        "from flink_agents_replay.api.mcp_tools import McpServer, mcp_tools\n"
        "server = McpServer(url='http://127.0.0.1:9/mcp')\n"
        "try:\n"
        "    mcp_tools(server)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'flink-agents-replay[mcp]'" in done.stdout


def test_side_effects_default_to_external_trust_annotations_and_overrides(server):
    assert {name: tool.side_effects.value for name, tool in mcp_tools(server).items()} == {
        "issue_refund": "external", "lookup_order": "external", "tag_order": "external"}
    trusted = mcp_tools(server, trust_annotations=True)
    assert {name: tool.side_effects.value for name, tool in trusted.items()} == {
        "issue_refund": "external", "lookup_order": "none", "tag_order": "idempotent"}
    set_by_hand = mcp_tools(server, trust_annotations=True, side_effects={"lookup_order": "external",
                                                                          "issue_refund": "idempotent"})
    assert {name: tool.side_effects.value for name, tool in set_by_hand.items()} == {
        "issue_refund": "idempotent", "lookup_order": "external", "tag_order": "idempotent"}
    with pytest.raises(ConfigError, match=r"does not list: \['refund'\]"):
        mcp_tools(server, side_effects={"refund": "none"})
    with pytest.raises(ConfigError, match="none, idempotent or external"):
        mcp_tools(server, side_effects={"lookup_order": "read-only"})
    assert all(tool.replay_default == "blocked" for tool in trusted.values())  # annotations do not matter


def test_a_tools_definition_is_stable_plain_data(server):
    first, second = mcp_tools(server)["lookup_order"], mcp_tools(server, prefix="o_")["o_lookup_order"]
    definition = first.definition()
    assert definition == json.loads(json.dumps(definition))
    assert definition == mcp_tools(server)["lookup_order"].definition()
    assert definition["mcp_name"] == "lookup_order" and definition["server"] == server.identity()
    assert definition["annotations"]["readOnlyHint"] is True and definition["input_schema"]["required"] == ["order_id"]
    assert second.definition()["name"] == "o_lookup_order" != definition["name"]


# --- processes: pickling, restarts, servers down ---------------------------------------------------------------


def test_a_pickled_tool_calls_from_a_fresh_process_through_its_own_session(db, tmp_path):
    tool = mcp_tools(stdio_server(db))["issue_refund"]
    pickled = tmp_path / "tool.pkl"
    pickled.write_bytes(cloudpickle.dumps(tool))
    key = unique("fresh")
    script = (
        "import json, pickle, sys\n"
        "from flink_agents_replay.api.call_site import _CALL_SITE, CallSite\n"
        "tool = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "_CALL_SITE.set(CallSite(call_id=sys.argv[2], stable_id='s', agent='a', resource='r', key_digest='k',"
        " seq=1, event_time_ms=None, epoch=1))\n"
        "print(json.dumps(tool.invoke(order_id='O-77777', amount=12.5)))\n")
    done = subprocess.run([sys.executable, "-c", script, str(pickled), key], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"refund_id": "R-O-77777", "order_id": "O-77777", "amount": 12.5,
                                       "status": "refunded"}
    (call,) = calls_with(db, key)
    assert call["executed"] and call["pid"] != os.getpid()


def test_a_stdio_server_killed_between_calls_is_started_again_and_each_call_acts_once(db):
    server = stdio_server(db, TEST_SESSION="stdio-restart")  # a session of its own
    pool = session_pool()
    first, second = unique("before-kill"), unique("after-kill")
    pool.call_tool(server, "issue_refund", {"order_id": "O-1", "amount": 1.0}, idempotency_key=first)
    (before,) = calls_with(db, first)
    os.kill(before["pid"], signal.SIGKILL)
    result = pool.call_tool(server, "issue_refund", {"order_id": "O-2", "amount": 2.0}, idempotency_key=second)
    assert result["order_id"] == "O-2"
    (after,) = calls_with(db, second)
    assert after["executed"] and after["pid"] != before["pid"]  # a new server process
    assert [c["executed"] for c in calls_with(db, first)] == [True]  # the first call was not made again


def test_an_http_server_restarted_between_calls_gets_a_new_session_and_each_call_acts_once(db):
    running = HttpServer(db, free_port()).start()
    try:
        server, pool = McpServer(url=running.url), session_pool()
        first, second = unique("before-restart"), unique("after-restart")
        pool.call_tool(server, "issue_refund", {"order_id": "O-3", "amount": 3.0}, idempotency_key=first)
        running.kill()
        running.start()  # the same port: the old session is unknown to the new process
        result = pool.call_tool(server, "issue_refund", {"order_id": "O-4", "amount": 4.0}, idempotency_key=second)
        assert result["order_id"] == "O-4"
        assert [c["executed"] for c in calls_with(db, first)] == [True]
        assert [c["executed"] for c in calls_with(db, second)] == [True]
    finally:
        running.kill()


def test_a_call_cut_short_is_in_doubt_and_made_again_under_its_key_acting_once(db):
    # The server answers 1.5 s after taking effect: a call can be cut short after its effect.
    server = stdio_server(db, FLINK_AGENTS_REPLAY_MCP_DELAY_S="1.5")
    (listed,) = [tool for tool in session_pool().list_tools(server) if tool["name"] == "issue_refund"]
    slow = McpTool(server, listed, timeout_s=0.3)  # on the session the listing opened
    with call_id(unique("timed-out")) as key, pytest.raises(CallTimeoutError, match="may still take effect"):
        slow.invoke(order_id="O-5", amount=5.0)
    assert [c["executed"] for c in calls_with(db, key)] == [True]  # it did: the call is in doubt, not failed

    # The server dies after the effect, before answering: the call is sent again, with its key, to a new server,
    # which answers it from the first one's effect.
    key, outcome = unique("server-died"), {}
    caller = threading.Thread(target=lambda: outcome.update(result=session_pool().call_tool(
        server, "issue_refund", {"order_id": "O-6", "amount": 6.0}, idempotency_key=key)))
    caller.start()
    deadline = time.monotonic() + 30
    while not calls_with(db, key) and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the server's record of the request
    (first,) = calls_with(db, key)
    os.kill(first["pid"], signal.SIGKILL)
    caller.join(timeout=60)
    assert outcome["result"] == first["result"]
    again = calls_with(db, key)
    assert [c["executed"] for c in again] == [True, False] and again[1]["pid"] != first["pid"]


def test_a_server_down_longer_than_the_retries_is_a_clear_error():
    pool = session_pool()
    down = McpServer(url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=5)
    started = time.monotonic()
    with pytest.raises(McpConnectionError, match=f"failed {ATTEMPTS} times") as caught:
        pool.call_tool(down, "lookup_order", {"order_id": "O-1"}, idempotency_key="k")
    waited = time.monotonic() - started
    assert waited >= sum(BACKOFF_MIN_S * 2 ** n for n in range(ATTEMPTS - 1)) * 0.9  # 0.2 + 0.4 + 0.8 s
    assert down.url in str(caught.value) and "ConnectError" in str(caught.value)
    # A stdio server that cannot start: its own words are in the error.
    with pytest.raises(McpConnectionError, match="stderr ends: .*No module named no_such_mcp_server_module"):
        mcp_tools(McpServer(command=sys.executable, args=["-m", "no_such_mcp_server_module"]))


# --- in the run engine -----------------------------------------------------------------------------------------


class Crash(Exception):
    pass


class ScriptedModel(Resource):
    """A chat model that asks for a refund on its first turn and answers with the tool's result on its second;
    raises ``Crash`` instead of its turn ``crash_at`` once."""

    def __init__(self, crash_at: int | None = None):
        super().__init__(side_effects="none")
        self.crash_at, self.turns = crash_at, 0

    def invoke(self, *, messages, tools, response_format=None):
        self.turns += 1
        if self.turns == self.crash_at:
            self.crash_at = None
            raise Crash("the process died before this model turn")
        assert [schema["function"]["name"] for schema in tools] == ["issue_refund"]
        answers = [message for message in messages if message["role"] == "tool"]
        if not answers:
            arguments = json.dumps({"order_id": messages[0]["content"], "amount": 20})
            return ChatResult(tool_calls=(ToolCall.from_json("t1", "issue_refund", arguments),),
                              finish_reason="tool_calls", model="scripted")
        return ChatResult(content=f"done: {answers[-1]['content']}", finish_reason="stop", model="scripted")


def refund_agent(tools: dict, model: ScriptedModel) -> Agent:
    class Refunds(Agent):
        @action(InputEvent)
        def refund(event, ctx):
            done = run_tool_loop(ctx, "llm", messages=[{"role": "user", "content": event.input}],
                                 tools=["issue_refund"], max_turns=3)
            ctx.send_event(OutputEvent(output=done.content))

    return Refunds(name="mcp-refunds", resources={"llm": model, **tools})


def run(agent: Agent, store: MemoryJournalStore, key: str, text: str, *, recover: bool = False):
    codec = RecordCodec(SIGNING_KEY, "op")
    index = read_recovery_index(store, codec, {KEY_GROUP: 0}, store.end_offsets([KEY_GROUP])) if recover else None
    return execute_run(agent, RunInput(key, KEY_GROUP, 1, text), {},
                       history=index.history(key_digest(key)) if index else None,
                       journal=JournalWriter(store, codec, Durability.PER_ACTION).run_journal(KEY_GROUP))


def test_a_tool_loop_calls_an_mcp_tool_once_across_a_crash_and_the_next_attempt_reuses_it(db):
    tools = {"issue_refund": mcp_tools(stdio_server(db))["issue_refund"]}
    order, key = f"O-{uuid.uuid4().int % 100000:05d}", unique("customer")
    model, store = ScriptedModel(crash_at=2), MemoryJournalStore(8)
    agent = refund_agent(tools, model)
    with pytest.raises(Crash):
        run(agent, store, key, order)  # the refund was made, then the next model turn died
    (made,) = [c for c in read_calls(db, "issue_refund") if c["arguments"]["order_id"] == order]
    assert made["executed"] and made["idempotency_key"].startswith("mcp-refunds:refund:")
    resumed = run(agent, store, key, order, recover=True)
    assert [o.output for o in resumed.outputs] == [
        f"done: {json.dumps(made['result'], sort_keys=True)}"]
    assert [c["executed"] for c in read_calls(db, "issue_refund") if c["arguments"]["order_id"] == order] == [True]
    assert model.turns == 3  # turn 1, the crash, turn 2: the tool call was reused, not made again
