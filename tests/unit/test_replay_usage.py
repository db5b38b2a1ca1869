"""Model usage and cost in the replay diff: what is counted, the nearest-rank percentiles, prices (with the
"*" fallback and unknown models), the deltas, the JSON / text / HTML reports, and the diff command's
--price / --prices options."""

import json

import pytest

from flink_agents_replay import cli
from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.replay import report as replay_report
from flink_agents_replay.replay.diff import DiffReport, compare
from flink_agents_replay.replay.prices import load_prices, parse_price, price_table, prices_from_json
from flink_agents_replay.replay.usage import Price, Usage, UsageComparison, percentile, usage_of
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedOutput, CapturedRun
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord

MINI = Price(0.15, 0.60)
BIG = Price(2.50, 10.00)
PRICES = {"gpt-4o-mini": MINI, "gpt-4o": BIG}


def call(position, **meta):
    return CallRecord(1, 0, "ev-1", "reply", position, "llm", f"args-{position}", CallOutcome.RETURNED, "result",
                      "d", meta=meta)


def model_call(position, model, latency_ms, prompt, completion):
    return call(position, latency_ms=latency_ms, model=model, prompt_tokens=prompt, completion_tokens=completion)


def run(key, seq, output, calls=()):
    return CapturedRun(key, seq, "d", outputs=[CapturedOutput(f"ev-{key}-{seq}", output)], calls=list(calls))


def inp(key, seq):
    return CapturedInput(key, seq, None, {"text": f"{key}/{seq}"}, "d")


# -- arithmetic ------------------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank():
    assert percentile(list(range(1, 11)), 50) == 5
    assert percentile(list(range(1, 11)), 95) == 10
    assert percentile([120.0, 80.0, 200.0, 40.0, 1000.0], 50) == 120.0  # ceil(2.5) = 3rd of 40, 80, 120, ...
    assert percentile([120.0, 80.0, 200.0, 40.0, 1000.0], 95) == 1000.0  # ceil(4.75) = 5th
    assert percentile([7.5], 50) == percentile([7.5], 95) == 7.5
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_usage_counts_model_calls_only_and_prices_them():
    calls = [model_call(0, "gpt-4o-mini", 120.0, 1000, 200), model_call(1, "gpt-4o-mini", 80.0, 3000, 400),
             model_call(2, "gpt-4o", 200.0, 2000, 1000),
             call(3, latency_ms=5.0)]  # a tool call: latency, no model
    usage = usage_of(calls, PRICES)
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (3, 6000, 1600)
    assert (usage.p50_ms, usage.p95_ms) == (120.0, 200.0)
    # mini: (4000 * 0.15 + 600 * 0.60) / 1e6 = 0.00096; 4o: (2000 * 2.5 + 1000 * 10) / 1e6 = 0.015
    assert usage.cost_usd == pytest.approx(0.01596)
    assert usage.unpriced_models == ()


def test_the_star_entry_prices_every_other_model():
    usage = usage_of([model_call(0, "claude-x", 10.0, 1_000_000, 500_000)], {"gpt-4o": BIG, "*": Price(1, 2)})
    assert usage.cost_usd == pytest.approx(2.0)  # 1M * $1/1M + 0.5M * $2/1M
    assert usage_of([model_call(0, "gpt-4o", 10.0, 1_000_000, 0)], {"gpt-4o": BIG, "*": Price(1, 2)}).cost_usd == 2.5


def test_a_model_without_a_price_makes_the_cost_unknown_not_an_error():
    usage = usage_of([model_call(0, "gpt-4o-mini", 10.0, 1000, 0), model_call(1, "mystery", 20.0, 10, 10)], PRICES)
    assert usage.cost_usd is None and usage.unpriced_models == ("mystery",)
    assert (usage.calls, usage.prompt_tokens) == (2, 1010)
    no_table = usage_of([model_call(0, "gpt-4o-mini", 10.0, 1000, 0)], None)
    assert no_table.cost_usd is None and no_table.unpriced_models == ("gpt-4o-mini",)
    assert usage_of([], None).cost_usd == 0.0  # nothing to price: nothing spent


def test_records_without_meta_count_no_model_calls():
    old = CallRecord(1, 0, "ev", "reply", 0, "llm", "a", CallOutcome.RETURNED, "r", "d")
    assert old.meta == {}
    usage = usage_of([old, call(1)], PRICES)
    assert usage == Usage() and usage.p50_ms is None and usage.cost_usd == 0.0
    report = compare([run("k", 1, "x", [old])], [run("k", 1, "y", [old])], [inp("k", 1)], prices=PRICES)
    assert not report.usage.has_model_calls
    assert report.to_json()["usage"]["production"]["model_calls"] == 0
    text = report.render_text()
    assert "Model usage: none, no model calls on either side" in text
    assert "latency p50" not in text
    assert "None: no model calls on either side." in report.render_html()


def test_malformed_meta_values_count_as_missing():
    usage = usage_of([call(0, model="m", prompt_tokens="many", completion_tokens=True, latency_ms=None)],
                     {"*": MINI})
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.p50_ms) == (1, 0, 0, None)
    assert usage.cost_usd == 0.0


def test_deltas_and_percentages():
    comparison = UsageComparison(Usage(4, (100.0, 200.0), 1000, 100, 0.5), Usage(2, (300.0,), 1500, 100, None))
    assert comparison.delta() == {"model_calls": -2, "latency_p50_ms": 200.0, "latency_p95_ms": 100.0,
                                  "prompt_tokens": 500, "completion_tokens": 0, "cost_usd": None}
    assert comparison.delta_percent() == {"model_calls": -50.0, "latency_p50_ms": 200.0, "latency_p95_ms": 50.0,
                                          "prompt_tokens": 50.0, "completion_tokens": 0.0, "cost_usd": None}
    from_nothing = UsageComparison(Usage(), Usage(1, (5.0,), 10, 1, 0.25))
    assert from_nothing.delta()["model_calls"] == 1 and from_nothing.delta_percent()["model_calls"] is None
    assert from_nothing.delta()["latency_p50_ms"] is None  # production has no latency to compare with


# -- in the diff report ----------------------------------------------------------------------------------


def usage_report() -> DiffReport:
    production = [run("a", 1, "old", [model_call(0, "gpt-4o-mini", 10.0, 1000, 100),
                                      model_call(1, "gpt-4o-mini", 20.0, 1000, 100)]),
                  run("b", 1, "same", [model_call(0, "gpt-4o-mini", 30.0, 2000, 200)])]
    replay = [run("a", 1, "new", [model_call(0, "gpt-4o", 40.0, 1000, 100)]),
              run("b", 1, "same", [model_call(0, "gpt-4o", 50.0, 2000, 300), call(1, latency_ms=1.0)])]
    return compare(production, replay, [inp("a", 1), inp("b", 1)], prices=PRICES)


def test_compare_keeps_each_runs_usage_and_the_total():
    report = usage_report()
    a, b = report.runs
    assert (a.production_usage.calls, a.production_usage.prompt_tokens, a.replay_usage.calls) == (2, 2000, 1)
    assert a.production_usage.cost_usd == pytest.approx((2000 * 0.15 + 200 * 0.60) / 1e6)
    assert a.replay_usage.cost_usd == pytest.approx((1000 * 2.5 + 100 * 10) / 1e6)
    assert b.usage.delta()["completion_tokens"] == 100
    total = report.usage
    assert (total.production.calls, total.replay.calls) == (3, 2)
    assert (total.production.prompt_tokens, total.production.completion_tokens) == (4000, 400)
    assert (total.replay.prompt_tokens, total.replay.completion_tokens) == (3000, 400)
    # Percentiles of the total are over all calls (10, 20, 30), not an average of the runs' percentiles.
    assert (total.production.p50_ms, total.production.p95_ms) == (20.0, 30.0)
    assert (total.replay.p50_ms, total.replay.p95_ms) == (40.0, 50.0)
    assert total.production.cost_usd == pytest.approx(0.00084)  # (4000 * 0.15 + 400 * 0.60) / 1e6
    assert total.replay.cost_usd == pytest.approx(0.0115)  # (3000 * 2.5 + 400 * 10) / 1e6
    assert total.delta()["cost_usd"] == pytest.approx(0.01066)


def test_a_side_without_a_run_has_no_usage():
    report = compare([run("k", 1, "v", [model_call(0, "gpt-4o-mini", 10.0, 100, 10)])], [], [inp("k", 1)],
                     prices=PRICES)
    only = report.runs[0]
    assert only.status == "missing" and only.replay_usage == Usage() and only.production_usage.calls == 1


def test_json_has_the_usage_as_plain_numbers():
    doc = usage_report().to_json()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    usage = doc["usage"]
    assert usage["production"]["model_calls"] == 3 and usage["replay"]["model_calls"] == 2
    assert usage["production"]["latency_p95_ms"] == 30.0 and usage["replay"]["latency_p50_ms"] == 40.0
    assert usage["delta"]["prompt_tokens"] == -1000 and usage["delta_percent"]["prompt_tokens"] == -25.0
    assert usage["replay"]["cost_usd"] == pytest.approx(0.0115)
    first = doc["runs"][0]
    assert first["production_usage"]["model_calls"] == 2 and first["replay_usage"]["prompt_tokens"] == 1000


def rows_of(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    table = lines[lines.index("Model usage") + 3:]
    rows = {}
    for line in table[:6]:
        label, _, values = line.partition("  ")
        rows[label] = values.split()
    return rows


def test_text_report_has_the_model_usage_table():
    text = usage_report().render_text(max_width=100)
    assert rows_of(text) == {
        "calls": ["3", "2", "-1", "-33.3%"],
        "latency p50 ms": ["20.0", "40.0", "+20.0", "+100.0%"],
        "latency p95 ms": ["30.0", "50.0", "+20.0", "+66.7%"],
        "prompt tokens": ["4000", "3000", "-1000", "-25.0%"],
        "completion tokens": ["400", "400", "+0", "+0.0%"],
        "cost USD": ["0.000840", "0.011500", "+0.010660", "+1269.0%"],
    }
    header = text.splitlines()[text.splitlines().index("Model usage") + 1]
    assert header.split() == ["production", "replay", "delta", "delta", "%"]


def test_the_usage_table_counts_calls_per_model_that_answered():
    text = usage_report().render_text(max_width=100)
    lines = text.splitlines()
    table = lines[lines.index("Model usage") + 9:lines.index("Model usage") + 11]
    assert [line.split() for line in table] == [
        ["calls", "to", "gpt-4o", "0", "2", "+2", "n/a"],
        ["calls", "to", "gpt-4o-mini", "3", "0", "-3", "-100.0%"]]
    usage = usage_report().to_json()["usage"]
    assert usage["production"]["calls_by_model"] == {"gpt-4o-mini": 3}
    assert usage["replay"]["calls_by_model"] == {"gpt-4o": 2}
    assert "calls to gpt-4o-mini" in usage_report().render_html()


def test_text_report_says_which_models_had_no_price():
    production = [run("k", 1, "v", [model_call(0, "gpt-4o-mini", 10.0, 100, 10)])]
    replay = [run("k", 1, "v", [model_call(0, "mystery", 10.0, 100, 10)])]
    report = compare(production, replay, [inp("k", 1)], prices={"gpt-4o-mini": MINI})
    text = report.render_text()
    assert rows_of(text)["cost USD"] == ["0.000021", "n/a", "n/a", "n/a"]
    assert "cost n/a: no price for model(s) mystery" in text
    assert "Cost n/a: no price for model(s) mystery." in report.render_html()


def test_html_report_has_the_usage_table_and_usage_per_key():
    page = usage_report().render_html()
    usage_section = page[page.index("<h2>Model usage</h2>"):page.index("<h2>Differing runs")]
    assert '<table class="usage">' in usage_section
    assert "<td>cost USD</td><td>0.000840</td><td>0.011500</td><td>+0.010660</td><td>+1269.0%</td>" in usage_section
    by_key = page[page.index("<h2>Runs by key</h2>"):page.index("<h2>Blocked calls")]
    assert "Model usage of key a" in by_key and "Model usage of key b" in by_key
    assert "<td>calls</td><td>2</td><td>1</td><td>-1</td><td>-50.0%</td>" in by_key  # key a
    assert "<td>completion tokens</td><td>200</td><td>300</td><td>+100</td><td>+50.0%</td>" in by_key  # key b


# -- price tables and the command line ---------------------------------------------------------------------


def test_parse_price():
    assert parse_price("gpt-4o-mini=0.15/0.60") == ("gpt-4o-mini", Price(0.15, 0.60))
    assert parse_price("*=1/2") == ("*", Price(1.0, 2.0))
    assert parse_price("openai/gpt-4o=2.5/10") == ("openai/gpt-4o", Price(2.5, 10.0))
    for bad in ("gpt-4o", "gpt-4o=1", "gpt-4o=1/2/3", "=1/2", "m=a/b", "m=-1/2", "m=nan/1", "m=1/inf"):
        with pytest.raises(ConfigError, match="--price"):
            parse_price(bad)


def test_prices_file(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"gpt-4o-mini": {"prompt_per_1m": 0.15, "completion_per_1m": 0.6},
                                "*": {"prompt_per_1m": 1, "completion_per_1m": 2}}))
    assert load_prices(path) == {"gpt-4o-mini": MINI, "*": Price(1.0, 2.0)}
    assert price_table(["gpt-4o-mini=0.2/0.8", "x=0/0"], path) == {"gpt-4o-mini": Price(0.2, 0.8),
                                                                   "*": Price(1.0, 2.0), "x": Price(0.0, 0.0)}
    assert price_table([], None) is None


@pytest.mark.parametrize("content, message", [
    ("{nope", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"m": {"prompt_per_1m": 1}}', "model 'm'"),
    ('{"m": {"prompt_per_1m": 1, "completion_per_1m": "2"}}', "'2' is not a price"),
    ('{"m": {"prompt_per_1m": true, "completion_per_1m": 2}}', "True is not a price"),
    ('{"m": {"prompt_per_1m": -1, "completion_per_1m": 2}}', "-1 is not a price"),
])
def test_bad_prices_files_are_config_errors(tmp_path, content, message):
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_prices(path)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_prices(tmp_path / "absent.json")
    assert prices_from_json({}) == {}


@pytest.fixture
def no_kafka(monkeypatch):
    """``diff_captures`` replaced: records what the command passed, returns a report with model usage."""
    seen = {}

    def fake_diff_captures(kafka, production, replay, **kwargs):
        seen.update(kwargs, production=production, replay=replay)
        return usage_report()

    monkeypatch.setattr(replay_report, "diff_captures", fake_diff_captures)
    return seen


def test_diff_command_passes_the_price_table(no_kafka, tmp_path, capsys):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"*": {"prompt_per_1m": 1, "completion_per_1m": 2}}))
    code = cli.main(["diff", "--replay", "r", "--production", "p", "--signing-key", "k" * 16,
                     "--price", "gpt-4o-mini=0.15/0.60", "--price", "*=3/4", "--prices", str(path),
                     "--json", str(tmp_path / "report.json")])
    assert code == 0
    assert no_kafka["prices"] == {"gpt-4o-mini": MINI, "*": Price(3.0, 4.0)}
    out = capsys.readouterr().out
    assert "Model usage" in out and "cost USD" in out
    assert json.loads((tmp_path / "report.json").read_text())["usage"]["production"]["model_calls"] == 3


def test_diff_command_without_prices_passes_none(no_kafka):
    assert cli.main(["diff", "--replay", "r", "--production", "p", "--signing-key", "k" * 16]) == 0
    assert no_kafka["prices"] is None


@pytest.mark.parametrize("options, message", [
    (["--price", "gpt-4o-mini"], "--price 'gpt-4o-mini': expected MODEL=PROMPT_PER_1M/COMPLETION_PER_1M"),
    (["--price", "m=0.1/x"], "--price 'm=0.1/x': 'x' is not a price"),
    (["--prices", "/nonexistent/prices.json"], "--prices '/nonexistent/prices.json': cannot read it"),
])
def test_diff_command_rejects_bad_prices_before_reading_kafka(no_kafka, capsys, options, message):
    code = cli.main(["diff", "--replay", "r", "--signing-key", "k" * 16, *options])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("flink-agents-replay: ") and message in err and "Traceback" not in err
    assert no_kafka == {}  # never got as far as the captures


def test_diff_parser_collects_repeated_prices():
    args = cli.build_parser().parse_args(["diff", "--replay", "r", "--price", "a=1/2", "--price", "*=3/4",
                                          "--prices", "p.json"])
    assert (args.price, args.prices) == (["a=1/2", "*=3/4"], "p.json")
    assert cli.build_parser().parse_args(["diff", "--replay", "r"]).price == []
