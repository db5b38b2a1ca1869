"""Compare what a replay produced with what production produced for the same inputs.

A replay runs a changed agent against inputs captured from production (:class:`CapturedInput`) and writes
one :class:`CapturedRun` per input it finished, and a :class:`CapturedParked` each time a run stops at a wait
with no decision. :func:`compare` lines those runs up with the production runs of the same input, identified by
``(key_digest(key), seq)``, and compares their outputs and their waits.

What is compared
    The compared set is every input the replay accepted: the union of the replay's inputs, of its runs and of
    its parked runs. Production runs of other inputs are ignored, since production keeps running past the
    replayed range. When a stream holds several records for one input (a capture may repeat a record after a
    failure), the last one wins; a finished run wins over a parked one: a run is *still waiting* when its
    side's capture holds a parked record of it and no finished run.

How a run is classified
    By the list of its output values (``[o.output for o in run.outputs]``, compared with ``==``; event ids
    are not compared, and neither are the calls a run made):

    * ``"same"``: both lists are equal (in particular, both are empty);
    * ``"changed"``: both are non-empty and differ;
    * ``"new"``: production produced nothing, the replay produced something;
    * ``"missing"``: production produced something, the replay produced nothing;
    * ``"waiting"``: the replay's run was still waiting at a wait when the replay ended (its wait is still
      open: production recorded no decision for it, and never finished the run either), whatever production did.

    A replay input without a replay run counts as a replay that produced nothing (note "the replay did not
    finish this input"); a replay run without a production run counts as a production run that produced
    nothing (note "no production run recorded for this input", or, when production's run was still waiting,
    "production's run was still waiting at a wait when its capture ended"). A replay run's ``error`` and the
    calls its side-effect policy blocked are kept on the run's :class:`RunDiff`, whatever its status.

Waits and decisions
    Each :class:`RunDiff` holds the waits each side's run reached (``ctx.wait_for``: their ``@wait`` and
    ``@decision`` calls, :func:`waits_of`), each with its decision (approved, denied, timed out, by whom, why)
    or still waiting, and pairs them up by what they ask (:attr:`RunDiff.waits`): a decision the replay changed
    (its wait policy ``deny``, say) shows there, and the report counts them (``decisions_changed``), with the
    waits the replay's runs reached (``waits``) and those still open at its end (``waiting``). The decisions
    are not part of the status (the outputs they lead to are). :attr:`DiffReport.has_differences` counts a
    run still waiting only when production was not waiting at the same question.

Usage and cost
    Each :class:`RunDiff` also holds the :class:`~.usage.Usage` of both runs' model calls (calls whose meta
    names a ``"model"``): how many, their latency p50 and p95 (nearest rank), prompt and completion tokens,
    and the cost in USD from the ``prices`` table given to :func:`compare` (per model, ``"*"`` for any other;
    unknown, ``None``, for a model without a price). :attr:`DiffReport.usage` adds them up over the report;
    :mod:`.usage` says exactly what is measured. Records written before calls had meta count no model calls.

Traces
    Each :class:`RunDiff` holds the trace id each side's capture recorded for its run (``CapturedRun.trace_id``,
    32 hex digits: where the run's spans are, with tracing on; a replay's runs trace under ``<service>-replay``,
    each in a trace of its own). ``None`` for a side without a finished run, and in captures written before 0.7.0.
    Given a :class:`TraceViewer` (a URL template such as Jaeger's ``http://jaeger:16686/trace/{trace_id}``, or
    :meth:`TraceViewer.phoenix`), the text and HTML reports link every run that differs or ended in an error to
    both traces (the JSON always has both ids).

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
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.replay.usage import METRICS, PriceTable, Usage, UsageComparison, usage_of
from flink_agents_replay.replay.word_diff import highlight_words
from flink_agents_replay.storage.capture.records import BlockedCall, CapturedInput, CapturedParked, CapturedRun
from flink_agents_replay.storage.records.journal import CallOutcome, CallRecord, key_digest
from flink_agents_replay.storage.records.waits import DECISION_RESOURCE, WAIT_RESOURCE, Decision, WaitOpened

__all__ = [
    "BlockedCallEntry",
    "DiffReport",
    "NOTE_INPUT_DIGEST_DIFFERS",
    "NOTE_NO_PRODUCTION_RUN",
    "NOTE_PRODUCTION_WAITING",
    "NOTE_REPLAY_NOT_FINISHED",
    "RunDiff",
    "STATUSES",
    "TraceViewer",
    "WAIT_CHANGES",
    "WaitEntry",
    "WaitRow",
    "compare",
    "pair_waits",
    "to_json_value",
    "waits_of",
]

#: Every status a run can have, in the order reports list them.
STATUSES = ("same", "changed", "new", "missing", "waiting")

NOTE_REPLAY_NOT_FINISHED = "the replay did not finish this input"
NOTE_NO_PRODUCTION_RUN = "no production run recorded for this input"
NOTE_PRODUCTION_WAITING = "production's run was still waiting at a wait when its capture ended"
NOTE_INPUT_DIGEST_DIFFERS = "production and replay ran inputs with different digests"


@dataclass
class RunDiff:
    """How the replay of one input compares with its production run.

    ``production`` and ``replay`` are the runs' output values; ``blocked`` and ``error`` come from the
    replay run; ``note`` says when a side had no run record (or the two sides ran different inputs);
    ``production_usage`` and ``replay_usage`` are the model calls of each side's run (none without a run);
    ``production_waits`` and ``replay_waits`` the waits each side's run reached, in order, with their decisions
    (a run still waiting: its calls so far, its last wait open); ``production_trace_id`` and ``replay_trace_id``
    the trace id each side's capture recorded for its finished run (``None`` without one: no finished run, or a
    capture written before 0.7.0).
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
    production_waits: list[WaitEntry] = field(default_factory=list)
    replay_waits: list[WaitEntry] = field(default_factory=list)
    production_trace_id: str | None = None
    replay_trace_id: str | None = None

    @property
    def usage(self) -> UsageComparison:
        """This run's model usage, production against replay."""
        return UsageComparison(self.production_usage, self.replay_usage)

    @property
    def waits(self) -> list[WaitRow]:
        """Production's waits next to the replay's, paired by what they ask, each with what changed."""
        return pair_waits(self.production_waits, self.replay_waits)

    @property
    def decisions_changed(self) -> int:
        """How many of the run's waits got another decision in the replay than in production (or one side's is
        still open and the other's decided)."""
        return sum(1 for row in self.waits if row.decision_changed)

    @property
    def open_wait(self) -> WaitEntry | None:
        """The wait the replay's run was still waiting at when the replay ended (status ``"waiting"``)."""
        return next((wait for wait in self.replay_waits if wait.open), None)

    @property
    def differs(self) -> bool:
        """Changed, new or missing; or still waiting where production was not waiting at the same question (a run
        production had not finished either, with no record of it, is no difference)."""
        if self.status == "waiting":
            if NOTE_NO_PRODUCTION_RUN in (self.note or ""):
                return False
            return any(row.change not in ("same", "still waiting") for row in self.waits)
        return self.status != "same"


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
        """Counts: compared runs, runs per status (``waiting``: the replay's runs still waiting when it ended, each
        at one wait still open), blocked calls, runs that ended in an error, the waits the replay's runs reached,
        and the waits whose decision the replay changed."""
        counts = {"compared": len(self.runs), **{status: 0 for status in STATUSES}}
        for run in self.runs:
            counts[run.status] += 1
        counts["blocked_calls"] = sum(len(run.blocked) for run in self.runs)
        counts["errors"] = sum(1 for run in self.runs if run.error is not None)
        counts["waits"] = sum(len(run.replay_waits) for run in self.runs)
        counts["decisions_changed"] = sum(run.decisions_changed for run in self.runs)
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
        """The runs whose status is changed, new or missing."""
        return [run for run in self.runs if run.status not in ("same", "waiting")]

    @property
    def waiting(self) -> list[RunDiff]:
        """The runs the replay left waiting at a wait: their waits were still open when it ended."""
        return [run for run in self.runs if run.status == "waiting"]

    @property
    def wait_rows(self) -> list[tuple[RunDiff, WaitRow]]:
        """Every wait of every compared run, production's next to the replay's, in run order."""
        return [(run, row) for run in self.runs for row in run.waits]

    @property
    def has_differences(self) -> bool:
        """Whether any run is changed, new or missing, or still waiting where production was not waiting at the same
        question."""
        return any(run.differs for run in self.runs)

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
                    "waits": [to_json_value(row.to_json()) for row in run.waits],
                    "decisions_changed": run.decisions_changed,
                    "production_trace_id": run.production_trace_id,
                    "replay_trace_id": run.replay_trace_id,
                }
                for run in self.runs
            ],
            "blocked_calls": [
                {"key": to_json_value(entry.key), "seq": entry.seq, **_blocked_json(entry)}
                for entry in self.blocked_calls
            ],
        }

    @property
    def traced(self) -> list[RunDiff]:
        """The runs a report links to their traces: changed, new or missing, or ended in an error; in run order."""
        return [run for run in self.runs if run.status not in ("same", "waiting") or run.error is not None]

    def render_text(self, max_width: int = 100, *, trace_viewer: TraceViewer | None = None) -> str:
        """A terminal report, lines at most ``max_width`` wide: counts, model usage, differing runs (with a
        ``trace_viewer``, the links to both traces of each run that differs or ended in an error), runs still
        waiting and every wait with its decisions (one line when no run reached a wait), blocked calls, errors.

        Values are shown on one line, as JSON where possible, and shortened with "…" to fit; links are never
        shortened (a cut link leads nowhere).
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
        if trace_viewer is not None:
            parts += _text_traces(self.traced, trace_viewer, max_width)
        parts += _text_waits(self, max_width)
        parts += _text_section("Blocked calls", ["key", "seq", "action", "resource", "arguments"], blocked, max_width)
        parts += _text_section("Errors", ["key", "seq", "error"], errors, max_width)
        return "\n".join(parts) + "\n"

    def render_html(self, *, trace_viewer: TraceViewer | None = None) -> str:
        """One self-contained HTML page (inline CSS, no external resources, every value escaped). With a
        ``trace_viewer``, the differing runs and the errors have a *traces* column: links to both sides' traces
        (``http``/``https`` only)."""
        body: list[str] = ["<h1>Replay diff</h1>", "<h2>Summary</h2>",
                           _html_table(["", "count"], [[_esc(name), _esc(n)] for name, n in self.summary.items()],
                                       cls="summary"),
                           "<h2>Model usage</h2>", *_html_usage(self.usage)]
        cells = {id(run): _output_cells(run) for run in self.runs}  # word diffs once per run, for both tables
        for section in (_html_differing(self.differing, cells, trace_viewer), *_html_waits(self),
                        _html_runs_by_key(self.runs, cells), _html_blocked(self.blocked_calls),
                        _html_errors(self.errors, trace_viewer)):
            body += section
        return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                "<title>Replay diff</title>\n<style>\n" + _CSS + "</style>\n</head>\n<body>\n"
                + "\n".join(body) + "\n</body>\n</html>\n")


#: Where a :class:`TraceViewer`'s template puts the trace id.
TRACE_ID_PLACE = "{trace_id}"
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


class TraceViewer:
    """Where a trace viewer shows a trace: a URL template with ``{trace_id}`` (the OpenTelemetry trace id, 32 lowercase
    hex digits), such as Jaeger's ``http://jaeger:16686/trace/{trace_id}`` or Grafana Tempo's explore URL.

    Only ``http`` and ``https`` URLs with a host and no spaces or control characters are taken (a
    :class:`ConfigError` otherwise); the template may hold
    other braces (only ``{trace_id}`` is replaced). :meth:`url` links only a well-formed trace id.
    """

    def __init__(self, template: str):
        if TRACE_ID_PLACE not in template:
            raise ConfigError(f"a trace URL template needs {TRACE_ID_PLACE} where the trace id goes: {template!r}")
        try:
            parts = urlsplit(template.replace(TRACE_ID_PLACE, "0" * 32))
            scheme, hostname = parts.scheme, parts.hostname
        except ValueError:  # an unclosed IPv6 host, say
            scheme = hostname = None
        # No spaces or control characters: a URL parser drops some of them, and a browser others.
        if scheme not in ("http", "https") or not hostname or any(
                ch.isspace() or not ch.isprintable() for ch in template):
            raise ConfigError(f"a trace URL must be an http or https URL with a host: {template!r}")
        self.template = template

    @classmethod
    def phoenix(cls, base_url: str) -> TraceViewer:
        """Arize Phoenix at ``base_url`` (its UI root): its route ``/redirects/traces/<trace id>`` opens the trace in
        whichever project holds it (the replay's service is a project of its own)."""
        return cls(base_url.rstrip("/") + "/redirects/traces/" + TRACE_ID_PLACE)

    def url(self, trace_id: str | None) -> str | None:
        """The trace's page, or ``None`` for no trace id or one that is not 32 lowercase hex digits."""
        if not isinstance(trace_id, str) or not _TRACE_ID.fullmatch(trace_id):
            return None
        return self.template.replace(TRACE_ID_PLACE, trace_id)

    def __repr__(self) -> str:
        return f"TraceViewer({self.template!r})"


def compare(production_runs: Iterable[CapturedRun | CapturedParked],
            replay_runs: Iterable[CapturedRun | CapturedParked], replay_inputs: Iterable[CapturedInput], *,
            prices: PriceTable | None = None) -> DiffReport:
    """Compare the replay's runs with production's for every input the replay accepted.

    ``production_runs`` and ``replay_runs`` are each side's finished runs and parked runs (either may be left
    out: without parked records no run is still waiting). The compared inputs are those of ``replay_inputs`` and
    ``replay_runs``, matched by ``(key_digest(key), seq)``; production runs of other inputs are ignored. For each
    input the last record of each kind wins, and a finished run wins over a parked one. See the module docstring
    for how runs are classified. ``prices`` (model name -> :class:`~.usage.Price`, ``"*"`` for any other model)
    prices the runs' model calls; without it, or for a model it does not price, costs are unknown (``None``).
    """
    inputs = _last_by_identity(replay_inputs)
    replayed = _Side.of(replay_runs)
    compared = inputs.keys() | replayed.identities()
    # The replay side is read first so that production, which may run far past the replayed range, is
    # streamed and only the runs of compared inputs are kept.
    production = _Side.of(run for run in production_runs if _identity(run) in compared)

    diffs = [_run_diff(identity[1], production.at(identity), replayed.at(identity), inputs.get(identity), prices)
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


# -- waits ---------------------------------------------------------------------------------------------------
# A run's waits are in its calls, as the capture keeps them: ``ctx.wait_for`` journals the wait as a call of the
# reserved resource ``@wait`` (its result a ``WaitOpened``) and its decision as a call of ``@decision`` (a
# ``Decision``), both with the digest of the wait's name and payload. A finished run's come from its CapturedRun,
# a parked run's from its CapturedParked, whose wait is *open* (still waiting when the capture ended). A wait with
# no decision in a finished run is one a replay blocked.

#: What a :class:`WaitRow` can say, production against replay.
WAIT_CHANGES = ("same", "changed", "still waiting", "production waiting", "replay waiting", "replay only",
                "production only")
#: The changes that are a change of decision (counted in the diff's ``decisions_changed``).
_DECISION_CHANGES = ("changed", "production waiting", "replay waiting")


@dataclass(frozen=True)
class WaitEntry:
    """A wait one side's run reached: where (action), what it asked (name, payload), and its decision; ``open`` when
    the run was still waiting at it when its capture ended (no decision)."""

    wait_id: str
    action: str
    name: str
    payload: Any
    decision: Decision | None = None
    open: bool = False

    @property
    def outcome(self) -> str:
        """``approved``, ``denied``, ``timed out``, ``decided`` (a decision that is only a value), ``still waiting``,
        or ``no decision`` (a replay blocked the wait)."""
        if self.open:
            return "still waiting"
        decision = self.decision
        if decision is None:
            return "no decision"
        if decision.timed_out:
            return "timed out"
        return {True: "approved", False: "denied"}.get(decision.approved, "decided")

    def describe(self) -> str:
        """The outcome for people: ``"denied by ana: too much"``, ``"approved by replay"``, ``"still waiting"``."""
        text = self.outcome
        decision = self.decision
        if decision is None:
            return text
        if decision.by:
            text += f" by {decision.by}"
        if decision.reason:
            text += f": {decision.reason}"
        if decision.value is not None:
            text += f" (value {json.dumps(decision.value, ensure_ascii=False, default=repr)})"
        return text

    def asks(self) -> str:
        """What the wait asks, on one line: its name and its payload as JSON."""
        return f"{self.name} {json.dumps(self.payload, ensure_ascii=False, sort_keys=True, default=repr)}"

    def to_json(self) -> dict[str, Any]:
        decision = self.decision
        return {"wait_id": self.wait_id, "action": self.action, "name": self.name, "payload": self.payload,
                "outcome": self.outcome, "open": self.open,
                "decision": None if decision is None else {
                    "approved": decision.approved, "value": decision.value, "reason": decision.reason,
                    "by": decision.by, "decided_at_ms": decision.decided_at_ms, "timed_out": decision.timed_out}}


@dataclass(frozen=True)
class WaitRow:
    """One wait, production's and the replay's (either may be ``None``: only one side asked it), and what changed
    (one of :data:`WAIT_CHANGES`)."""

    production: WaitEntry | None
    replay: WaitEntry | None

    @property
    def change(self) -> str:
        production, replay = self.production, self.replay
        if production is None:
            return "replay only"
        if replay is None:
            return "production only"
        if production.open or replay.open:
            if production.open and replay.open:
                return "still waiting"
            return "replay waiting" if replay.open else "production waiting"
        return "same" if _outcome(production.decision) == _outcome(replay.decision) else "changed"

    @property
    def asks(self) -> str:
        return (self.replay or self.production).asks()

    @property
    def decision_changed(self) -> bool:
        return self.change in _DECISION_CHANGES

    def to_json(self) -> dict[str, Any]:
        entry = self.replay or self.production
        return {"action": entry.action, "name": entry.name, "payload": entry.payload, "change": self.change,
                "production": None if self.production is None else self.production.to_json(),
                "replay": None if self.replay is None else self.replay.to_json()}


def _outcome(decision: Decision | None) -> tuple | None:
    """What a decision decided (who decided, why and when are detail: production's "approved by ana" and the replay
    policy's "approved by replay" are the same decision)."""
    return None if decision is None else (decision.approved, decision.timed_out, to_json_value(decision.value))


def waits_of(calls: Iterable[CallRecord], open_wait: WaitOpened | None = None,
             open_action: str = "") -> list[WaitEntry]:
    """The waits among a run's ``calls``, each with its decision, in the order the run reached them.

    ``open_wait``: the wait a parked run waits at, in action ``open_action`` (marked open; added if its ``@wait``
    record is not among the calls)."""
    entries: list[WaitEntry] = []
    undecided: dict[tuple[str, str, str], list[int]] = defaultdict(list)  # where a wait is -> its entries
    for call in calls:
        if call.outcome is not CallOutcome.RETURNED:
            continue
        where = (call.event_id, call.action, call.args_digest)
        if call.resource == WAIT_RESOURCE and isinstance(call.result, WaitOpened):
            if any(entry.wait_id == call.result.wait_id for entry in entries):
                continue  # the same wait reused again (a resumed run lists it once)
            undecided[where].append(len(entries))
            wait = call.result
            entries.append(WaitEntry(wait.wait_id, call.action, wait.name, wait.payload))
        elif call.resource == DECISION_RESOURCE and isinstance(call.result, Decision) and undecided[where]:
            index = undecided[where].pop(0)
            entries[index] = replace(entries[index], decision=call.result)
    if open_wait is not None:
        entries = _mark_open(entries, open_wait, open_action)
    return entries


def _mark_open(entries: list[WaitEntry], wait: WaitOpened, action: str) -> list[WaitEntry]:
    for index, entry in enumerate(entries):
        if entry.wait_id == wait.wait_id:
            return [*entries[:index], replace(entry, decision=None, open=True), *entries[index + 1:]]
    return [*entries, WaitEntry(wait.wait_id, action, wait.name, wait.payload, open=True)]


def pair_waits(production: list[WaitEntry], replay: list[WaitEntry]) -> list[WaitRow]:
    """Production's waits of a run next to the replay's, matched by what they ask (action, name, payload), each once
    and in order; production's order first, then waits only the replay asked."""
    unmatched: dict[tuple[str, str, str], list[WaitEntry]] = defaultdict(list)
    for entry in replay:
        unmatched[_question(entry)].append(entry)
    rows = []
    for entry in production:
        candidates = unmatched.get(_question(entry))
        rows.append(WaitRow(entry, candidates.pop(0) if candidates else None))
    matched = {id(row.replay) for row in rows if row.replay is not None}
    rows += [WaitRow(None, entry) for entry in replay if id(entry) not in matched]
    return rows


def _question(entry: WaitEntry) -> tuple[str, str, str]:
    return entry.action, entry.name, json.dumps(entry.payload, sort_keys=True, default=repr)


# -- comparison ----------------------------------------------------------------------------------------


@dataclass
class _Side:
    """One side's records of the compared inputs: the last finished run and the last parked run of each."""

    finished: dict[tuple[str, int], CapturedRun] = field(default_factory=dict)
    parked: dict[tuple[str, int], CapturedParked] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[CapturedRun | CapturedParked]) -> _Side:
        side = cls()
        for record in records:
            (side.parked if isinstance(record, CapturedParked) else side.finished)[_identity(record)] = record
        return side

    def identities(self) -> set[tuple[str, int]]:
        return self.finished.keys() | self.parked.keys()

    def at(self, identity: tuple[str, int]) -> CapturedRun | CapturedParked | None:
        """The input's finished run; else its parked run (still waiting); else ``None``."""
        return self.finished.get(identity) or self.parked.get(identity)


def _run_diff(seq: int, production_run: CapturedRun | CapturedParked | None,
              replay_run: CapturedRun | CapturedParked | None, replay_input: CapturedInput | None,
              prices: PriceTable | None) -> RunDiff:
    """The comparison of one input's runs (either may be missing or parked, not both of the run and the input)."""
    production_outputs = _outputs(production_run)
    replay_outputs = _outputs(replay_run)
    return RunDiff(
        key=(replay_run or replay_input).key,
        seq=seq,
        status="waiting" if isinstance(replay_run, CapturedParked) else _classify(production_outputs,
                                                                                   replay_outputs),
        production=production_outputs,
        replay=replay_outputs,
        blocked=list(replay_run.blocked) if replay_run is not None else [],
        error=replay_run.error if isinstance(replay_run, CapturedRun) else None,
        note=_note(production_run, replay_run, replay_input),
        production_usage=_usage(production_run, prices),
        replay_usage=_usage(replay_run, prices),
        production_waits=_waits(production_run),
        replay_waits=_waits(replay_run),
        production_trace_id=_trace_id(production_run),
        replay_trace_id=_trace_id(replay_run),
    )


def _note(production_run: CapturedRun | CapturedParked | None, replay_run: CapturedRun | CapturedParked | None,
          replay_input: CapturedInput | None) -> str | None:
    notes = []
    if replay_run is None:
        notes.append(NOTE_REPLAY_NOT_FINISHED)
    if production_run is None:
        notes.append(NOTE_NO_PRODUCTION_RUN)
    elif isinstance(production_run, CapturedParked):
        notes.append(NOTE_PRODUCTION_WAITING)
    # Outputs of different inputs are not comparable: say so rather than report a silent "changed".
    digests = {r.input_digest for r in (production_run, replay_run, replay_input) if r is not None}
    digests.discard("")
    if len(digests) > 1:
        notes.append(NOTE_INPUT_DIGEST_DIFFERS)
    return "; ".join(notes) or None


def _trace_id(run: CapturedRun | CapturedParked | None) -> str | None:
    """A finished run's trace id as its capture recorded it (a parked run's record holds none)."""
    return run.trace_id if isinstance(run, CapturedRun) else None


def _usage(run: CapturedRun | CapturedParked | None, prices: PriceTable | None) -> Usage:
    return Usage() if run is None else usage_of(run.calls, prices)


def _waits(run: CapturedRun | CapturedParked | None) -> list[WaitEntry]:
    if run is None:
        return []
    if isinstance(run, CapturedParked):
        return waits_of(run.calls, run.wait, run.action)
    return waits_of(run.calls)


def _total_usage(runs: Iterable[RunDiff]) -> UsageComparison:
    production, replay = Usage(), Usage()
    for run in runs:
        production += run.production_usage
        replay += run.replay_usage
    return UsageComparison(production, replay)


def _identity(record: CapturedInput | CapturedRun | CapturedParked) -> tuple[str, int]:
    return (key_digest(record.key), record.seq)


def _last_by_identity(records: Iterable[Any]) -> dict[tuple[str, int], Any]:
    return {_identity(record): record for record in records}  # a later record of an identity replaces it


def _outputs(run: CapturedRun | CapturedParked | None) -> list[Any]:
    return [] if not isinstance(run, CapturedRun) else [output.output for output in run.outputs]


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


def _text_traces(runs: list[RunDiff], viewer: TraceViewer, max_width: int) -> list[str]:
    """Per run that differs or ended in an error, with a trace on either side: a line naming it, then the link to
    production's trace and the replay's ("-": that side recorded none)."""
    lines, n_runs = [], 0
    for run in runs:
        links = [viewer.url(run.production_trace_id), viewer.url(run.replay_trace_id)]
        if not any(links):
            continue
        n_runs += 1
        status = run.status + (", error" if run.error is not None else "")
        lines.append(_shorten(f"{_one_line(run.key)}  {run.seq}  {status}", max_width))
        lines += [f"  {side:<10}  {link or _NONE}" for side, link in zip(("production", "replay"), links, strict=True)]
    return ["", f"Traces of differing runs ({n_runs})", *(lines or ["  none: no such run recorded a trace id"])]


def _text_section(title: str, headers: list[str], rows: list[list[str]], max_width: int,
                  empty: str = "none") -> list[str]:
    """A titled table of the report, or the title and ``empty`` when there are no rows."""
    return ["", f"{title} ({len(rows)})", _text_table(headers, rows, max_width) if rows else f"  {empty}"]


_NO_WAITS = "no run reached a wait on either side"
_WAIT_HEADERS = ["key", "seq", "wait", "production", "replay", "change"]
_WAITING_HEADERS = ["key", "seq", "action", "wait", "wait id", "production"]


def _text_waits(report: DiffReport, max_width: int) -> list[str]:
    """The "Still waiting" and "Waits and decisions" tables, or one line when no run reached a wait."""
    if not report.wait_rows:
        return ["", _shorten(f"Waits: none, {_NO_WAITS}", max_width)]
    waiting = [[_one_line(cell) for cell in row] for row in _waiting_rows(report)]
    waits = [[_one_line(cell) for cell in row] for row in _wait_rows(report)]
    return (_text_section("Still waiting", _WAITING_HEADERS, waiting, max_width,
                          "none: no wait was still open when the replay ended")
            + _text_section("Waits and decisions", _WAIT_HEADERS, waits, max_width))


def _waiting_rows(report: DiffReport) -> list[list[str]]:
    """Per run the replay left waiting: its open wait, and what production's run did at the same question."""
    rows = []
    for run in report.waiting:
        wait = run.open_wait
        row = next((row for row in run.waits if row.replay is wait), None)
        production = row.production.describe() if row is not None and row.production is not None else _NONE
        rows.append([run.key, str(run.seq), wait.action, wait.asks(), wait.wait_id, production])
    return rows


def _wait_rows(report: DiffReport) -> list[list[str]]:
    """Per wait of every run: what it asks, production's and the replay's outcome, and what changed."""
    return [[run.key, str(run.seq), row.asks, _describe(row.production), _describe(row.replay), row.change]
            for run, row in report.wait_rows]


_NONE = "-"


def _describe(entry: WaitEntry | None) -> str:
    return _NONE if entry is None else entry.describe()


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
    rows = [[label, _metric(name, before[name]), _metric(name, after[name]), _metric(name, delta[name], sign="+"),
             "n/a" if percent[name] is None else f"{percent[name]:+.1f}%"]
            for name, label in METRICS]
    return rows + _per_model_rows(usage)


def _per_model_rows(usage: UsageComparison) -> list[list[str]]:
    """A row per model that answered a call on either side: its calls, production against replay."""
    models = sorted({model for side in (usage.production, usage.replay) for model, _ in side.calls_by_model})
    rows = []
    for model in models:
        before, after = usage.production.calls_to(model), usage.replay.calls_to(model)
        percent = f"{(after - before) / before * 100:+.1f}%" if before else "n/a"
        rows.append([f"  calls to {model}", str(before), str(after), f"{after - before:+d}", percent])
    return rows


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
.status-new { color: #1f5fb3; } .status-missing { color: #b32020; } .status-waiting { color: #6b3fb3; }
.change { font-weight: bold; } .change-same { color: #2a7a2a; font-weight: normal; }
.change-changed, .change-production-waiting, .change-replay-waiting { color: #b36b00; }
.change-still-waiting { color: #6b3fb3; }
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


def _trace_links(run: RunDiff, viewer: TraceViewer) -> str:
    """A cell linking both sides' traces of a run (already escaped; "-" for a side without one)."""
    cells = []
    for side, trace_id in (("production", run.production_trace_id), ("replay", run.replay_trace_id)):
        url = viewer.url(trace_id)
        cells.append(f'<a href="{_esc(url)}" rel="noreferrer">{side}</a>' if url else f"{side}: {_NONE}")
    return "<br>".join(cells)


def _html_differing(differing: list[RunDiff], cells: dict[int, list[str]],
                    viewer: TraceViewer | None = None) -> list[str]:
    parts = [f"<h2>Differing runs ({len(differing)})</h2>"]
    if not differing:
        return parts + ["<p>None: the replay produced the same outputs as production.</p>"]
    traces = ["traces"] if viewer is not None else []
    return parts + [_html_table(["key", "seq", "status", "production", "replay", *traces],
                                [[_esc(run.key), _esc(run.seq), _status_html(run.status), *cells[id(run)],
                                  *([_trace_links(run, viewer)] if viewer is not None else [])]
                                 for run in differing],
                                cls="runs")]


def _html_waits(report: DiffReport) -> list[list[str]]:
    """The "Still waiting" and "Waits and decisions" sections, or one line when no run reached a wait."""
    if not report.wait_rows:
        return [["<h2>Waits and decisions</h2>", f"<p>None: {_NO_WAITS}.</p>"]]
    still = [f"<h2>Still waiting ({len(report.waiting)})</h2>"]
    waiting = _waiting_rows(report)
    still += [_html_table(_WAITING_HEADERS, [[_esc(cell) for cell in row[:3]] + [_pre_text(row[3])]
                                             + [_esc(cell) for cell in row[4:]] for row in waiting], cls="waiting")
              if waiting else "<p>None: no wait was still open when the replay ended.</p>"]
    rows = [[_esc(run.key), _esc(run.seq), _pre_text(row.asks), _esc(_describe(row.production)),
             _esc(_describe(row.replay)), _change_html(row.change)] for run, row in report.wait_rows]
    return [still, [f"<h2>Waits and decisions ({len(rows)})</h2>", _html_table(_WAIT_HEADERS, rows, cls="waits")]]


def _change_html(change: str) -> str:
    return f'<span class="change change-{_esc(change.replace(" ", "-"))}">{_esc(change)}</span>'


def _waits_cell(run: RunDiff) -> str:
    """A run's waits in one cell: what each asks, production's outcome -> the replay's."""
    return "<br>".join(f"{_esc(row.asks)}: {_esc(_describe(row.production))} &rarr; {_esc(_describe(row.replay))}"
                       for row in run.waits)


def _html_runs_by_key(runs: list[RunDiff], cells: dict[int, list[str]]) -> list[str]:
    parts = ["<h2>Runs by key</h2>"]
    if not runs:
        parts.append("<p>No runs were compared.</p>")
    for key, key_runs in _group_by_key(runs):
        n_differing = sum(1 for run in key_runs if run.status not in ("same", "waiting"))
        n_waiting = sum(1 for run in key_runs if run.status == "waiting")
        opened = " open" if n_differing or n_waiting else ""
        waiting = f", {n_waiting} still waiting" if n_waiting else ""
        parts.append(f"<details{opened}><summary>key {_esc(key)}: {len(key_runs)} run(s), "
                     f"{n_differing} differing{waiting}</summary>")
        parts.append(_html_table(
            ["seq", "status", "production", "replay", "waits", "note", "error", "blocked"],
            [[_esc(run.seq), _status_html(run.status), *cells[id(run)], _waits_cell(run), _esc(run.note or ""),
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


def _html_errors(errors: list[RunDiff], viewer: TraceViewer | None = None) -> list[str]:
    parts = [f"<h2>Errors ({len(errors)})</h2>"]
    if not errors:
        return parts + ["<p>None.</p>"]
    traces = ["traces"] if viewer is not None else []
    return parts + [_html_table(["key", "seq", "error", *traces],
                                [[_esc(run.key), _esc(run.seq), _pre_text(run.error or ""),
                                  *([_trace_links(run, viewer)] if viewer is not None else [])] for run in errors],
                                cls="errors")]


def _group_by_key(runs: list[RunDiff]) -> list[tuple[Any, list[RunDiff]]]:
    groups: dict[str, tuple[Any, list[RunDiff]]] = {}
    for run in runs:  # runs are sorted by (str(key), seq): groups come out in key order
        groups.setdefault(key_digest(run.key), (run.key, []))[1].append(run)
    return list(groups.values())
