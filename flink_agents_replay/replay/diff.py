"""Compare what a replay produced with what production produced for the same inputs.

A replay runs a changed agent against inputs captured from production (:class:`CapturedInput`) and writes
one :class:`CapturedRun` per input it finished. :func:`compare` lines those runs up with the production
runs of the same input, identified by ``(key_digest(key), seq)``, and compares their outputs.

What is compared
    The compared set is every input the replay accepted: the union of the replay's inputs and of its runs.
    Production runs of other inputs are ignored, since production keeps running past the replayed range.
    When a stream holds several records for one input (a capture may repeat a record after a failure),
    the last one wins.

How a run is classified
    By the list of its output values (``[o.output for o in run.outputs]``, compared with ``==``; event ids
    are not compared, and neither are the calls a run made):

    * ``"same"``: both lists are equal (in particular, both are empty);
    * ``"changed"``: both are non-empty and differ;
    * ``"new"``: production produced nothing, the replay produced something;
    * ``"missing"``: production produced something, the replay produced nothing.

    A replay input without a replay run counts as a replay that produced nothing (note "the replay did not
    finish this input"); a replay run without a production run counts as a production run that produced
    nothing (note "no production run recorded for this input"). A replay run's ``error`` and the calls its
    side-effect policy blocked are kept on the run's :class:`RunDiff`, whatever its status.

Usage and cost
    Each :class:`RunDiff` also holds the :class:`~.usage.Usage` of both runs' model calls (calls whose meta
    names a ``"model"``): how many, their latency p50 and p95 (nearest rank), prompt and completion tokens,
    and the cost in USD from the ``prices`` table given to :func:`compare` (per model, ``"*"`` for any other;
    unknown, ``None``, for a model without a price). :attr:`DiffReport.usage` adds them up over the report;
    :mod:`.usage` says exactly what is measured. Records written before calls had meta count no model calls.

The :class:`DiffReport` renders as JSON (:meth:`DiffReport.to_json`), as a terminal report
(:meth:`DiffReport.render_text`) and as one self-contained HTML page (:meth:`DiffReport.render_html`). Each
shows the model usage, production against replay with deltas (the text report says in one line when neither
side made a model call). In the HTML page, the outputs of a differing run are shown with the words the replay
removed struck out (``<del>``) and those it inserted marked (``<ins>``), word by word over their JSON
(:mod:`.word_diff`).
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.replay.usage import METRICS, PriceTable, Usage, UsageComparison, usage_of
from flink_agents_replay.replay.word_diff import highlight_words
from flink_agents_replay.storage.capture.records import BlockedCall, CapturedInput, CapturedRun
from flink_agents_replay.storage.records.journal import key_digest

__all__ = [
    "BlockedCallEntry",
    "DiffReport",
    "NOTE_INPUT_DIGEST_DIFFERS",
    "NOTE_NO_PRODUCTION_RUN",
    "NOTE_REPLAY_NOT_FINISHED",
    "RunDiff",
    "STATUSES",
    "compare",
    "to_json_value",
]

#: Every status a run can have, in the order reports list them.
STATUSES = ("same", "changed", "new", "missing")

NOTE_REPLAY_NOT_FINISHED = "the replay did not finish this input"
NOTE_NO_PRODUCTION_RUN = "no production run recorded for this input"
NOTE_INPUT_DIGEST_DIFFERS = "production and replay ran inputs with different digests"


@dataclass
class RunDiff:
    """How the replay of one input compares with its production run.

    ``production`` and ``replay`` are the runs' output values; ``blocked`` and ``error`` come from the
    replay run; ``note`` says when a side had no run record (or the two sides ran different inputs);
    ``production_usage`` and ``replay_usage`` are the model calls of each side's run (none without a run).
    """

    key: Any
    seq: int
    status: str
    production: list[Any] = field(default_factory=list)
    replay: list[Any] = field(default_factory=list)
    blocked: list[BlockedCall] = field(default_factory=list)
    error: str | None = None
    note: str | None = None
    production_usage: Usage = field(default_factory=Usage)
    replay_usage: Usage = field(default_factory=Usage)

    @property
    def usage(self) -> UsageComparison:
        """This run's model usage, production against replay."""
        return UsageComparison(self.production_usage, self.replay_usage)


@dataclass(frozen=True)
class BlockedCallEntry:
    """A call the replay's side-effect policy blocked, with the input (key, seq) whose run it was in."""

    key: Any
    seq: int
    event_id: str
    action: str
    position: int
    resource: str
    arguments: str


@dataclass
class DiffReport:
    """The result of :func:`compare`: one :class:`RunDiff` per compared input, sorted by ``(str(key), seq)``."""

    runs: list[RunDiff] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, int]:
        """Counts: compared runs, runs per status, blocked calls and runs that ended in an error."""
        counts = {"compared": len(self.runs), **{status: 0 for status in STATUSES}}
        for run in self.runs:
            counts[run.status] += 1
        counts["blocked_calls"] = sum(len(run.blocked) for run in self.runs)
        counts["errors"] = sum(1 for run in self.runs if run.error is not None)
        return counts

    @property
    def usage(self) -> UsageComparison:
        """The model usage of all compared runs, production against replay (percentiles over all their calls)."""
        return _total_usage(self.runs)

    @property
    def blocked_calls(self) -> list[BlockedCallEntry]:
        """Every blocked call of every compared run, in run order."""
        return [
            BlockedCallEntry(run.key, run.seq, call.event_id, call.action, call.position, call.resource,
                             call.arguments)
            for run in self.runs
            for call in run.blocked
        ]

    @property
    def errors(self) -> list[RunDiff]:
        """The runs whose replay ended in an error."""
        return [run for run in self.runs if run.error is not None]

    @property
    def differing(self) -> list[RunDiff]:
        """The runs whose status is not ``"same"``."""
        return [run for run in self.runs if run.status != "same"]

    @property
    def has_differences(self) -> bool:
        """Whether any run is changed, new or missing."""
        return bool(self.differing)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-serialisable dict (values converted by :func:`to_json_value`)."""
        return {
            "summary": self.summary,
            "usage": self.usage.to_json(),
            "runs": [
                {
                    "key": to_json_value(run.key),
                    "seq": run.seq,
                    "status": run.status,
                    "production": to_json_value(run.production),
                    "replay": to_json_value(run.replay),
                    "blocked": [_blocked_json(call) for call in run.blocked],
                    "error": run.error,
                    "note": run.note,
                    "production_usage": run.production_usage.to_json(),
                    "replay_usage": run.replay_usage.to_json(),
                }
                for run in self.runs
            ],
            "blocked_calls": [
                {"key": to_json_value(entry.key), "seq": entry.seq, **_blocked_json(entry)}
                for entry in self.blocked_calls
            ],
        }

    def render_text(self, max_width: int = 100) -> str:
        """A terminal report, lines at most ``max_width`` wide: counts, model usage, differing runs, blocked
        calls, errors.

        Values are shown on one line, as JSON where possible, and shortened with "…" to fit.
        """
        summary = self.summary
        parts = ["Replay diff", "", _text_table(["", "count"], [[name, str(n)] for name, n in summary.items()],
                                                max_width)]
        parts += _text_usage(self.usage, max_width)

        differing = [[_one_line(run.key), str(run.seq), run.status,
                      *(_one_line_json(side) for side in _differing_fields(run.production, run.replay))]
                     for run in self.differing]
        blocked = [[_one_line(entry.key), str(entry.seq), entry.action, entry.resource, _one_line(entry.arguments)]
                   for entry in self.blocked_calls]
        errors = [[_one_line(run.key), str(run.seq), _one_line(run.error)] for run in self.errors]
        parts += _text_section("Differing runs", ["key", "seq", "status", "production", "replay"], differing,
                               max_width, "none: the replay produced the same outputs as production")
        parts += _text_section("Blocked calls", ["key", "seq", "action", "resource", "arguments"], blocked, max_width)
        parts += _text_section("Errors", ["key", "seq", "error"], errors, max_width)
        return "\n".join(parts) + "\n"

    def render_html(self) -> str:
        """One self-contained HTML page (inline CSS, no external resources, every value escaped)."""
        body: list[str] = ["<h1>Replay diff</h1>", "<h2>Summary</h2>",
                           _html_table(["", "count"], [[_esc(name), _esc(n)] for name, n in self.summary.items()],
                                       cls="summary"),
                           "<h2>Model usage</h2>", *_html_usage(self.usage)]
        cells = {id(run): _output_cells(run) for run in self.runs}  # word diffs once per run, for both tables
        for section in (_html_differing(self.differing, cells), _html_runs_by_key(self.runs, cells),
                        _html_blocked(self.blocked_calls), _html_errors(self.errors)):
            body += section
        return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                "<title>Replay diff</title>\n<style>\n" + _CSS + "</style>\n</head>\n<body>\n"
                + "\n".join(body) + "\n</body>\n</html>\n")


def compare(production_runs: Iterable[CapturedRun], replay_runs: Iterable[CapturedRun],
            replay_inputs: Iterable[CapturedInput], *, prices: PriceTable | None = None) -> DiffReport:
    """Compare the replay's runs with production's for every input the replay accepted.

    The compared inputs are those of ``replay_inputs`` and ``replay_runs``, matched by
    ``(key_digest(key), seq)``; production runs of other inputs are ignored. For each input the last record
    of each iterable wins. See the module docstring for how runs are classified. ``prices`` (model name ->
    :class:`~.usage.Price`, ``"*"`` for any other model) prices the runs' model calls; without it, or for a
    model it does not price, costs are unknown (``None``).
    """
    inputs = _last_by_identity(replay_inputs)
    replayed = _last_by_identity(replay_runs)
    compared = inputs.keys() | replayed.keys()
    # The replay side is read first so that production, which may run far past the replayed range, is
    # streamed and only the runs of compared inputs are kept.
    production = _last_by_identity(run for run in production_runs if _identity(run) in compared)

    diffs = [_run_diff(identity[1], production.get(identity), replayed.get(identity), inputs.get(identity), prices)
             for identity in compared]
    # The digest breaks ties between keys with the same str() (1 and "1"), so the order is deterministic.
    diffs.sort(key=lambda run: (str(run.key), run.seq, key_digest(run.key)))
    return DiffReport(diffs)


def to_json_value(value: Any) -> Any:
    """``value`` made JSON-serialisable: JSON types kept, anything else replaced by its ``repr``.

    Lists and tuples become arrays; dicts keep their string keys, other keys become their ``repr``;
    non-finite floats (not valid JSON) and self-containing structures become their ``repr``.
    """
    return _to_json(value, set())


# -- comparison ----------------------------------------------------------------------------------------


def _run_diff(seq: int, production_run: CapturedRun | None, replay_run: CapturedRun | None,
              replay_input: CapturedInput | None, prices: PriceTable | None) -> RunDiff:
    """The comparison of one input's runs (either may be missing, not both of the run and the input)."""
    production_outputs = _outputs(production_run)
    replay_outputs = _outputs(replay_run)
    return RunDiff(
        key=(replay_run or replay_input).key,
        seq=seq,
        status=_classify(production_outputs, replay_outputs),
        production=production_outputs,
        replay=replay_outputs,
        blocked=list(replay_run.blocked) if replay_run is not None else [],
        error=replay_run.error if replay_run is not None else None,
        note=_note(production_run, replay_run, replay_input),
        production_usage=_usage(production_run, prices),
        replay_usage=_usage(replay_run, prices),
    )


def _note(production_run: CapturedRun | None, replay_run: CapturedRun | None,
          replay_input: CapturedInput | None) -> str | None:
    notes = []
    if replay_run is None:
        notes.append(NOTE_REPLAY_NOT_FINISHED)
    if production_run is None:
        notes.append(NOTE_NO_PRODUCTION_RUN)
    # Outputs of different inputs are not comparable: say so rather than report a silent "changed".
    digests = {r.input_digest for r in (production_run, replay_run, replay_input) if r is not None}
    digests.discard("")
    if len(digests) > 1:
        notes.append(NOTE_INPUT_DIGEST_DIFFERS)
    return "; ".join(notes) or None


def _usage(run: CapturedRun | None, prices: PriceTable | None) -> Usage:
    return Usage() if run is None else usage_of(run.calls, prices)


def _total_usage(runs: Iterable[RunDiff]) -> UsageComparison:
    production, replay = Usage(), Usage()
    for run in runs:
        production += run.production_usage
        replay += run.replay_usage
    return UsageComparison(production, replay)


def _identity(record: CapturedInput | CapturedRun) -> tuple[str, int]:
    return (key_digest(record.key), record.seq)


def _last_by_identity(records: Iterable[Any]) -> dict[tuple[str, int], Any]:
    return {_identity(record): record for record in records}  # a later record of an identity replaces it


def _outputs(run: CapturedRun | None) -> list[Any]:
    return [] if run is None else [output.output for output in run.outputs]


def _classify(production: list[Any], replay: list[Any]) -> str:
    if not production and not replay:
        return "same"
    if not production:
        return "new"
    if not replay:
        return "missing"
    return "same" if _equal(production, replay) else "changed"


def _equal(left: list[Any], right: list[Any]) -> bool:
    try:
        return bool(left == right)
    except Exception:
        # Some values (numpy arrays, ...) refuse a truth value for ==; their repr is the best we have.
        return repr(left) == repr(right)


# -- value conversion ----------------------------------------------------------------------------------


def _to_json(value: Any, seen: set[int]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        # bool/int/str subclasses (enums, ...) are reduced to the plain type json.dumps would write.
        if isinstance(value, bool) or value is None:
            return value
        return int(value) if isinstance(value, int) else str.__str__(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple, dict)):
        if id(value) in seen:
            return repr(value)
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return {k if isinstance(k, str) else repr(k): _to_json(v, seen) for k, v in value.items()}
            return [_to_json(item, seen) for item in value]
        finally:
            seen.discard(id(value))
    return _safe_repr(value)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a broken __repr__ must not break the report
        return f"<{type(value).__name__} object: repr failed: {exc!r}>"


def _blocked_json(call: BlockedCall | BlockedCallEntry) -> dict[str, Any]:
    return {"event_id": call.event_id, "action": call.action, "position": call.position,
            "resource": call.resource, "arguments": call.arguments}


def _text_section(title: str, headers: list[str], rows: list[list[str]], max_width: int,
                  empty: str = "none") -> list[str]:
    """A titled table of the report, or the title and ``empty`` when there are no rows."""
    return ["", f"{title} ({len(rows)})", _text_table(headers, rows, max_width) if rows else f"  {empty}"]


def _differing_fields(production: list[Any], replay: list[Any]) -> tuple[Any, Any]:
    """What to show of a changed run in a narrow table: of outputs that are dicts pairwise, only the fields
    that differ (the rest is the same on both sides); otherwise the outputs themselves."""
    if len(production) != len(replay) or not all(isinstance(o, dict) for o in (*production, *replay)):
        return production, replay
    shown: tuple[list[dict], list[dict]] = ([], [])
    for before, after in zip(production, replay, strict=True):
        fields = [k for k in dict.fromkeys([*before, *after]) if not _equal([before.get(k)], [after.get(k)])]
        pairs = {k: _after_common_prefix(before.get(k), after.get(k)) for k in fields}
        shown[0].append({k: pair[0] for k, pair in pairs.items()})
        shown[1].append({k: pair[1] for k, pair in pairs.items()})
    return shown


def _after_common_prefix(before: Any, after: Any, keep: int = 8) -> tuple[Any, Any]:
    """Two texts that start alike, from shortly before where they differ ("…" marks the cut)."""
    if not (isinstance(before, str) and isinstance(after, str)):
        return before, after
    common = len(os.path.commonprefix([before, after]))
    if common <= keep + 12:
        return before, after
    cut = before.rfind(" ", 0, common - keep) + 1 or common - keep
    return _ELLIPSIS + before[cut:], _ELLIPSIS + after[cut:]


def _one_line_json(value: Any) -> str:
    return json.dumps(to_json_value(value), ensure_ascii=False)


def _one_line(value: Any) -> str:
    """``value`` as text on one line: control characters escaped so a table row stays one row."""
    text = value if isinstance(value, str) else str(value)
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# -- text rendering ------------------------------------------------------------------------------------

_ELLIPSIS = "…"
_SEPARATOR = "  "
_MIN_COLUMN = 5


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + _ELLIPSIS


def _text_table(headers: list[str], rows: list[list[str]], max_width: int) -> str:
    widths = [max([len(header)] + [len(row[i]) for row in rows]) for i, header in enumerate(headers)]
    # Shrink the widest column one character at a time: long values give way before short ones.
    budget = max_width - len(_SEPARATOR) * (len(headers) - 1)
    floors = [min(width, max(len(header), _MIN_COLUMN)) for width, header in zip(widths, headers, strict=True)]
    while sum(widths) > budget:
        shrinkable = [i for i, width in enumerate(widths) if width > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1

    def line(cells: list[str]) -> str:
        return _SEPARATOR.join(_shorten(cell, w).ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(row) for row in rows])


_USAGE_HEADERS = ["", "production", "replay", "delta", "delta %"]
_NO_MODEL_CALLS = "no model calls on either side"


def _text_usage(usage: UsageComparison, max_width: int) -> list[str]:
    """The "Model usage" table, or one line when neither side made a model call."""
    if not usage.has_model_calls:
        return ["", _shorten(f"Model usage: none, {_NO_MODEL_CALLS}", max_width)]
    lines = ["", "Model usage", _text_table(_USAGE_HEADERS, _usage_rows(usage), max_width)]
    unpriced = _unpriced(usage)
    if unpriced:
        lines.append(_shorten(f"  cost n/a: {unpriced}", max_width))
    return lines


def _usage_rows(usage: UsageComparison) -> list[list[str]]:
    """Per metric: its label, production's and the replay's values, the delta and the delta in percent."""
    before, after = usage.production.metrics(), usage.replay.metrics()
    delta, percent = usage.delta(), usage.delta_percent()
    return [[label, _metric(name, before[name]), _metric(name, after[name]), _metric(name, delta[name], sign="+"),
             "n/a" if percent[name] is None else f"{percent[name]:+.1f}%"]
            for name, label in METRICS]


def _metric(name: str, value: int | float | None, sign: str = "") -> str:
    """A metric's value for people: costs to the micro-dollar, latencies to a tenth of a ms, counts whole."""
    if value is None:
        return "n/a"
    if name == "cost_usd":
        return f"{value:{sign}.6f}"
    if name.startswith("latency"):
        return f"{value:{sign}.1f}"
    return f"{int(value):{sign}d}"


def _unpriced(usage: UsageComparison) -> str:
    """Which models left a cost unknown, or "" when every model call was priced."""
    models = sorted({*usage.production.unpriced_models, *usage.replay.unpriced_models})
    return f"no price for model(s) {', '.join(models)}" if models else ""


# -- HTML rendering ------------------------------------------------------------------------------------

_CSS = """\
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
table.runs td:nth-child(4), table.runs td:nth-child(5) { width: 40%; }
table.key-runs td:nth-child(3), table.key-runs td:nth-child(4) { width: 35%; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word; font-size: 0.9em; }
.status { font-weight: bold; }
.status-same { color: #2a7a2a; } .status-changed { color: #b36b00; }
.status-new { color: #1f5fb3; } .status-missing { color: #b32020; }
details { margin: 0.4em 0; } summary { cursor: pointer; }
table.usage td:not(:first-child) { text-align: right; font-variant-numeric: tabular-nums; }
.usage-title { margin: 0.6em 0 0.2em; font-weight: bold; }
del { background: #fbd3d3; color: #8a1010; text-decoration: line-through; }
ins { background: #cdeccd; color: #0f5a0f; text-decoration: none; }
"""


def _esc(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def _json_text(values: Any) -> str:
    return json.dumps(to_json_value(values), ensure_ascii=False, indent=2)


def _pre(values: Any) -> str:
    return _pre_text(_json_text(values))


def _output_cells(run: RunDiff) -> list[str]:
    """Production's and the replay's outputs; for a differing run, with the changed words marked."""
    if run.status == "same":
        return [_pre(run.production), _pre(run.replay)]
    return [f"<pre>{fragment}</pre>" for fragment in highlight_words(_json_text(run.production),
                                                                     _json_text(run.replay))]


def _pre_text(text: str) -> str:
    return f"<pre>{_esc(text)}</pre>"


def _status_html(status: str) -> str:
    return f'<span class="status status-{_esc(status)}">{_esc(status)}</span>'


def _html_table(headers: list[str], rows: list[list[str]], cls: str) -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{_esc(header)}</th>" for header in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>\n" for row in rows)
    return f'<table class="{_esc(cls)}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>'


def _html_usage(usage: UsageComparison) -> list[str]:
    """The model usage table (already escaped), or a line saying neither side made a model call."""
    if not usage.has_model_calls:
        return [f"<p>None: {_NO_MODEL_CALLS}.</p>"]
    table = _html_table(_USAGE_HEADERS, [[_esc(cell) for cell in row] for row in _usage_rows(usage)], cls="usage")
    unpriced = _unpriced(usage)
    return [table, f"<p>Cost n/a: {_esc(unpriced)}.</p>"] if unpriced else [table]


def _html_differing(differing: list[RunDiff], cells: dict[int, list[str]]) -> list[str]:
    parts = [f"<h2>Differing runs ({len(differing)})</h2>"]
    if not differing:
        return parts + ["<p>None: the replay produced the same outputs as production.</p>"]
    return parts + [_html_table(["key", "seq", "status", "production", "replay"],
                                [[_esc(run.key), _esc(run.seq), _status_html(run.status), *cells[id(run)]]
                                 for run in differing],
                                cls="runs")]


def _html_runs_by_key(runs: list[RunDiff], cells: dict[int, list[str]]) -> list[str]:
    parts = ["<h2>Runs by key</h2>"]
    if not runs:
        parts.append("<p>No runs were compared.</p>")
    for key, key_runs in _group_by_key(runs):
        n_differing = sum(1 for run in key_runs if run.status != "same")
        opened = " open" if n_differing else ""
        parts.append(f"<details{opened}><summary>key {_esc(key)}: {len(key_runs)} run(s), "
                     f"{n_differing} differing</summary>")
        parts.append(_html_table(
            ["seq", "status", "production", "replay", "note", "error", "blocked"],
            [[_esc(run.seq), _status_html(run.status), *cells[id(run)], _esc(run.note or ""),
              _pre_text(run.error) if run.error is not None else "", _esc(len(run.blocked))] for run in key_runs],
            cls="key-runs"))
        usage = _total_usage(key_runs)
        if usage.has_model_calls:
            parts += [f"<p class=\"usage-title\">Model usage of key {_esc(key)}</p>", *_html_usage(usage)]
        parts.append("</details>")
    return parts


def _html_blocked(blocked: list[BlockedCallEntry]) -> list[str]:
    parts = [f"<h2>Blocked calls ({len(blocked)})</h2>"]
    if not blocked:
        return parts + ["<p>None.</p>"]
    return parts + [_html_table(
        ["key", "seq", "event", "action", "position", "resource", "arguments"],
        [[_esc(e.key), _esc(e.seq), _esc(e.event_id), _esc(e.action), _esc(e.position), _esc(e.resource),
          _pre_text(e.arguments)] for e in blocked],
        cls="blocked")]


def _html_errors(errors: list[RunDiff]) -> list[str]:
    parts = [f"<h2>Errors ({len(errors)})</h2>"]
    if not errors:
        return parts + ["<p>None.</p>"]
    return parts + [_html_table(["key", "seq", "error"],
                                [[_esc(run.key), _esc(run.seq), _pre_text(run.error or "")] for run in errors],
                                cls="errors")]


def _group_by_key(runs: list[RunDiff]) -> list[tuple[Any, list[RunDiff]]]:
    groups: dict[str, tuple[Any, list[RunDiff]]] = {}
    for run in runs:  # runs are sorted by (str(key), seq): groups come out in key order
        groups.setdefault(key_digest(run.key), (run.key, []))[1].append(run)
    return list(groups.values())
