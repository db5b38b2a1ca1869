"""The replay diff and traces (issue 37): each compared run carries the trace ids both captures recorded, and with a
trace viewer configured the text and HTML reports link the runs that differ (or ended in an error) to both traces."""

from __future__ import annotations

import argparse
import html
import json
import re

import pytest

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.jobs import agent_job, replay_job
from flink_agents_replay.jobs.trace_flags import tracing
from flink_agents_replay.replay.diff import TraceViewer, compare
from flink_agents_replay.storage.capture.records import CapturedInput, CapturedOutput, CapturedParked, CapturedRun
from flink_agents_replay.storage.records.waits import WaitOpened

PROD = {seq: f"{seq:02x}" + "a" * 30 for seq in range(1, 7)}
REPL = {seq: f"{seq:02x}" + "b" * 30 for seq in range(1, 7)}
JAEGER = "http://jaeger:16686/trace/{trace_id}"


def run(key, seq, *outputs, trace_id=None, error=None):
    return CapturedRun(key, seq, "d", outputs=[CapturedOutput(f"ev-{seq}-{i}", o) for i, o in enumerate(outputs)],
                       error=error, trace_id=trace_id)


def inp(key, seq):
    return CapturedInput(key, seq, None, {"n": seq}, "d")


def report_of_every_kind():
    """seq 1 same, 2 changed, 3 new (no production run), 4 missing (replay error), 5 changed without trace ids
    (captures written before 0.7), 6 still waiting (a parked replay run has no trace id)."""
    production = [run("k", 1, "x", trace_id=PROD[1]), run("k", 2, "x", trace_id=PROD[2]),
                  run("k", 4, "x", trace_id=PROD[4]), run("k", 5, "x"), run("k", 6, "x", trace_id=PROD[6])]
    replay = [run("k", 1, "x", trace_id=REPL[1]), run("k", 2, "y", trace_id=REPL[2]),
              run("k", 3, "z", trace_id=REPL[3]), run("k", 4, trace_id=REPL[4], error="ValueError: boom"),
              run("k", 5, "y"), CapturedParked("k", 6, "d", "act", "ev", WaitOpened("w-6", "ok?", {}, None, 0))]
    return compare(production, replay, [inp("k", seq) for seq in range(1, 7)])


def by_seq(report):
    return {r.seq: r for r in report.runs}


def test_each_run_carries_both_sides_trace_ids_from_the_captured_runs():
    runs = by_seq(report_of_every_kind())
    assert {seq: (r.production_trace_id, r.replay_trace_id) for seq, r in runs.items()} == {
        1: (PROD[1], REPL[1]), 2: (PROD[2], REPL[2]), 3: (None, REPL[3]), 4: (PROD[4], REPL[4]), 5: (None, None),
        6: (PROD[6], None)}
    assert [runs[seq].status for seq in range(1, 7)] == ["same", "changed", "new", "missing", "changed", "waiting"]


def test_the_json_report_names_both_trace_ids_or_null():
    as_json = json.loads(json.dumps(report_of_every_kind().to_json()))
    assert {r["seq"]: (r["production_trace_id"], r["replay_trace_id"]) for r in as_json["runs"]} == {
        1: (PROD[1], REPL[1]), 2: (PROD[2], REPL[2]), 3: (None, REPL[3]), 4: (PROD[4], REPL[4]), 5: (None, None),
        6: (PROD[6], None)}


def test_without_a_viewer_the_reports_hold_no_links_and_are_as_before():
    report = report_of_every_kind()
    text, page = report.render_text(), report.render_html()
    assert "Traces" not in text and "http" not in text
    assert "<a " not in page and PROD[2] not in page and REPL[2] not in page
    assert report.render_text(trace_viewer=None) == text and report.render_html(trace_viewer=None) == page


def test_the_text_report_links_each_differing_or_failed_run_to_both_traces_whole():
    text = report_of_every_kind().render_text(max_width=60, trace_viewer=TraceViewer(JAEGER))
    section = text.split("Traces of differing runs")[1].split("\n\n")[0]
    # changed (2), new (3: production has no trace), missing with an error (4); not the same run (1), not the run
    # with no trace on either side (5), not the run still waiting (6)
    assert f"http://jaeger:16686/trace/{PROD[2]}" in section and f"http://jaeger:16686/trace/{REPL[2]}" in section
    assert f"http://jaeger:16686/trace/{REPL[3]}" in section
    assert f"http://jaeger:16686/trace/{PROD[4]}" in section and f"http://jaeger:16686/trace/{REPL[4]}" in section
    for seq in (1, 5, 6):
        assert PROD[seq] not in text and REPL[seq] not in text
    assert section.startswith(" (3)")
    # URLs are never shortened to fit the width: a cut link leads nowhere
    assert all("…" not in line for line in section.splitlines() if "http" in line)
    assert re.search(r"production\s+-", section.split("k  3")[1])  # the new run: no production trace


def test_the_html_report_links_each_differing_and_error_run_to_both_traces():
    page = report_of_every_kind().render_html(trace_viewer=TraceViewer(JAEGER))
    hrefs = re.findall(r'<a href="([^"]*)"', page)
    assert set(hrefs) == {f"http://jaeger:16686/trace/{t}" for t in (PROD[2], REPL[2], REPL[3], PROD[4], REPL[4])}
    differing = page.split("<h2>Differing runs")[1].split("<h2>")[0]
    assert "<th>traces</th>" in differing and differing.count("<a href=") == 5
    errors = page.split("<h2>Errors")[1].split("<h2>")[0]
    assert errors.count("<a href=") == 2 and PROD[4] in errors and REPL[4] in errors


def test_every_value_of_a_link_is_escaped_in_html():
    viewer = TraceViewer('https://viewer.example/t?id={trace_id}&x="<script>')
    page = report_of_every_kind().render_html(trace_viewer=viewer)
    assert '"<script>' not in page and "&x=" not in page
    assert f'<a href="https://viewer.example/t?id={PROD[2]}&amp;x=&quot;&lt;script&gt;"' in page
    assert html.unescape(f"https://viewer.example/t?id={PROD[2]}&amp;x=&quot;&lt;script&gt;") == viewer.url(PROD[2])


def test_a_trace_id_that_is_not_32_hex_digits_is_shown_but_never_put_into_a_link():
    odd = '"><script>alert(1)</script>'
    report = compare([run("k", 1, "x", trace_id=odd)], [run("k", 1, "y", trace_id=REPL[1])], [inp("k", 1)])
    viewer = TraceViewer(JAEGER)
    assert viewer.url(odd) is None and viewer.url(REPL[1].upper()) is None and viewer.url(None) is None
    page = report.render_html(trace_viewer=viewer)
    assert "<script>" not in page and re.findall(r'<a href="([^"]*)"', page) == [JAEGER.format(trace_id=REPL[1])]
    assert report.to_json()["runs"][0]["production_trace_id"] == odd  # the JSON says what the capture says


@pytest.mark.parametrize("template", ["javascript:alert('{trace_id}')", "file:///tmp/{trace_id}", "//host/{trace_id}",
                                      "http://jaeger:16686/trace/", "data:text/html,{trace_id}", "http:///{trace_id}",
                                      "java\tscript:alert('{trace_id}')", " http://jaeger/{trace_id}",
                                      "ht\ttp://jaeger/{trace_id}", "http://[::1/{trace_id}"])
def test_only_http_and_https_templates_with_a_trace_id_place_are_taken(template):
    with pytest.raises(ConfigError):
        TraceViewer(template)


def test_a_template_may_hold_other_braces_and_the_phoenix_shortcut_is_its_redirect_route():
    assert TraceViewer("https://tempo.example/explore?q={{x}}&t={trace_id}").url(REPL[1]) == \
        f"https://tempo.example/explore?q={{{{x}}}}&t={REPL[1]}"
    # Phoenix (the version local/phoenix_server.py pins) redirects /redirects/traces/<otel trace id> to the trace's
    # page in whichever project holds it.
    assert TraceViewer.phoenix("http://127.0.0.1:6006/").url(REPL[1]) == \
        f"http://127.0.0.1:6006/redirects/traces/{REPL[1]}"
    assert TraceViewer.phoenix("https://phoenix.example/prefix").template == \
        "https://phoenix.example/prefix/redirects/traces/{trace_id}"
    with pytest.raises(ConfigError):
        TraceViewer.phoenix("ftp://phoenix.example")


def test_the_diff_command_takes_a_template_or_a_phoenix_url_not_both(capsys):
    from flink_agents_replay.cli import _trace_viewer, build_parser

    parser = build_parser()
    args = parser.parse_args(["diff", "--replay", "r", "--trace-url-template", JAEGER])
    assert _trace_viewer(args).template == JAEGER
    args = parser.parse_args(["diff", "--replay", "r", "--trace-viewer-url", "http://127.0.0.1:6006"])
    assert _trace_viewer(args).template == "http://127.0.0.1:6006/redirects/traces/{trace_id}"
    assert _trace_viewer(parser.parse_args(["diff", "--replay", "r"])) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["diff", "--replay", "r", "--trace-url-template", JAEGER, "--trace-viewer-url", "http://p"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_replay_job_takes_the_main_jobs_trace_flags(monkeypatch):
    monkeypatch.setenv("FLINK_AGENTS_REPLAY_SIGNING_KEY", "0123456789abcdef0123")
    flags = [["--trace"], ["--otlp-endpoint", "http://collector:4318"], ["--trace", "--trace-content"], []]
    for extra in flags:
        main = agent_job.parse_args(extra)
        replay = replay_job.parse_args(["--replay-name", "try", *extra])
        assert tracing(main) == tracing(replay)
    assert tracing(replay_job.parse_args(["--replay-name", "try"])) is None
    assert tracing(replay_job.parse_args(["--replay-name", "try", "--otlp-endpoint", "http://c:4318"])) == {
        "endpoint": "http://c:4318", "capture_content": None}
    assert tracing(argparse.Namespace(trace=True, otlp_endpoint=None, trace_content=True)) == {
        "endpoint": None, "capture_content": True}
    assert tracing(agent_job.parse_args(["--trace-content"])) == {"endpoint": None, "capture_content": True}
