"""The packaged main job's command line: durability modes by their current names, the old one still taken; order
lookups from an MCP server."""

import socket

import pytest

from flink_agents_replay.jobs import agent_job

COMMON = ["--bootstrap-servers", "127.0.0.1:9092"]


def test_the_help_offers_the_current_modes_and_the_old_name_still_runs_per_run(capsys, monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    assert agent_job.parse_args([*COMMON, "--durability", "per_bundle"]).durability == "per_run"
    assert agent_job.parse_args(COMMON).durability == "per_run"
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--help"])
    assert "per_bundle" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--durability", "per_nothing"])
    assert "invalid choice: 'per_nothing'" in capsys.readouterr().err


def test_signals_and_waits_topics_are_optional(monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    args = agent_job.parse_args(COMMON)
    assert args.signals_topic is None and args.waits_topic is None
    args = agent_job.parse_args([*COMMON, "--signals-topic", "decisions", "--waits-topic", "waits"])
    assert (args.signals_topic, args.waits_topic) == ("decisions", "waits")
    assert agent_job.WAITS_TOPIC_CONFIG == {"cleanup.policy": "compact"}


def test_later_tickets_hold_by_default_and_may_run_while_one_waits(monkeypatch, capsys):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    assert agent_job.parse_args(COMMON).later_inputs_while_waiting == "hold"
    assert agent_job.parse_args([*COMMON, "--later-inputs-while-waiting", "run"]).later_inputs_while_waiting == "run"
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--later-inputs-while-waiting", "skip"])
    assert "invalid choice: 'skip'" in capsys.readouterr().err


def test_orders_from_an_mcp_server_are_optional_and_a_bad_url_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    assert agent_job.parse_args(COMMON).orders_mcp_url is None
    url = "http://127.0.0.1:8765/mcp"
    assert agent_job.parse_args([*COMMON, "--orders-mcp-url", url]).orders_mcp_url == url
    with pytest.raises(SystemExit):
        agent_job.parse_args([*COMMON, "--orders-mcp-url", "127.0.0.1:8765"])
    assert "--orders-mcp-url: McpServer url= must be an http(s) URL" in capsys.readouterr().err


def test_an_orders_mcp_server_out_of_reach_fails_the_submission_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/mcp"
    # Listed before anything else is built: no Flink environment, no topics.
    monkeypatch.setattr(agent_job, "create_environment", lambda **_: pytest.fail("the job went on being built"))
    assert agent_job.main([*COMMON, "--orders-mcp-url", url]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flink_agents_replay.jobs")]
    assert line.startswith(f"flink_agents_replay.jobs.agent_job: listing the tools of the MCP server at {url} failed")


def test_the_orders_tool_is_the_mcp_servers_lookup_order_read_only_and_the_stub_model_calls_it(tmp_path):
    from flink_agents_replay.api.mcp_tools import McpTool
    from flink_agents_replay.api.resources import SideEffects
    from flink_agents_replay.engine import RunInput, execute_run
    from flink_agents_replay.examples.support_triage import make_tickets, support_triage_agent
    from flink_agents_replay.integrations.mcp_client import session_pool
    from flink_agents_replay.local.mcp_orders_server import LocalMcpOrdersServer
    from flink_agents_replay.local.model_server import StubModelServer
    from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
    from flink_agents_replay.storage.journal.writer import Durability, JournalWriter
    from flink_agents_replay.storage.records.codec import RecordCodec

    orders = LocalMcpOrdersServer(tmp_path / "mcp")
    url = orders.start()
    try:
        with StubModelServer(port=0) as model:
            def replies(**settings) -> list[dict]:
                agent = support_triage_agent(name="triage-mcp", model_base_url=model.base_url, **settings)
                journal = JournalWriter(MemoryJournalStore(8), RecordCodec(b"k" * 32, "op"), Durability.PER_ACTION)
                return [execute_run(agent, RunInput(t["customer"], 3, 1, t), {}, journal=journal.run_journal(3))
                        .outputs[0].output for t in make_tickets(6)]

            over_http = replies()
            assert orders.lookups() == 0
            tool = support_triage_agent(model_base_url=model.base_url, orders_mcp_url=url).resources["orders"]
            assert isinstance(tool, McpTool) and tool.mcp_name == "lookup_order"
            assert tool.side_effects is SideEffects.NONE  # its read-only annotation trusted
            assert replies(orders_mcp_url=url) == over_http  # the same replies, the same order statuses
        lookups = orders.calls("lookup_order")
        with_order = [t["order_id"] for t in make_tickets(6) if t["order_id"]]
        assert [call["arguments"]["order_id"] for call in lookups] == with_order and orders.lookups() == len(with_order)
        assert all(call["idempotency_key"].startswith("triage-mcp:draft_reply:") for call in lookups)
    finally:
        session_pool().close_sessions()  # this process's session with the server, before the server goes
        orders.stop()
    assert orders.url is None
