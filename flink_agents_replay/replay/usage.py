"""What a run's model calls cost: how many, how long they took, how many tokens, how many dollars.

A replay diff (:mod:`.diff`) shows these beside the outputs, production against replay, so a change of
prompt or model is judged on its price as well as on its answers.

What is measured
    A *model call* is a call whose record's ``meta`` holds a ``"model"`` (the resource reported it with
    :func:`~flink_agents_replay.api.call_site.report_call`). Other calls, and records written before meta existed
    (``meta == {}``), are not counted. In a replay, calls served ``recorded`` carry no meta: the replay's
    figures are what the replay itself spent.

    For a set of model calls, :class:`Usage` holds

    * ``calls``: how many there were;
    * the latency percentiles p50 and p95 in milliseconds, over the calls' ``"latency_ms"`` (a call without
      one is counted in ``calls`` but has no latency). Percentiles are *nearest-rank*: with the ``n``
      latencies sorted ascending, the p-th percentile is the ``ceil(p / 100 * n)``-th of them (1-based), so it
      is always one of the measured values; with no latency it is ``None``;
    * ``prompt_tokens`` and ``completion_tokens``: the sums of the calls' ``"prompt_tokens"`` and
      ``"completion_tokens"`` (missing or non-numeric counts count 0);
    * ``calls_by_model``: the calls per model, by the name the service answered with (with fallbacks, which
      model answered how many);
    * ``cost_usd``: per call, ``prompt_tokens * prompt_per_1m / 1e6 + completion_tokens * completion_per_1m
      / 1e6`` with the :class:`Price` of the call's model in a price table (the ``"*"`` entry for a model the
      table does not name), summed. When some call's model has no price (or no table is given) the cost is
      unknown: ``None``, and the model is listed in ``unpriced_models``.

    Usages add up (``a + b``): counts and costs are summed, and the percentiles of a sum are computed anew
    over all its latencies, not averaged. A :class:`UsageComparison` holds production's and the replay's usage
    and their deltas: ``replay - production``, and that delta in percent of production's value when production's
    is neither zero nor unknown.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flink_agents_replay.storage.records.journal import CallRecord

__all__ = ["FALLBACK_MODEL", "METRICS", "Price", "PriceTable", "Usage", "UsageComparison", "call_cost",
           "percentile", "price_for", "usage_of"]

#: The price table entry for every model it does not name.
FALLBACK_MODEL = "*"

#: The compared quantities in report order: (name in :meth:`Usage.metrics` and JSON, label in reports).
METRICS: tuple[tuple[str, str], ...] = (
    ("model_calls", "calls"),
    ("latency_p50_ms", "latency p50 ms"),
    ("latency_p95_ms", "latency p95 ms"),
    ("prompt_tokens", "prompt tokens"),
    ("completion_tokens", "completion tokens"),
    ("cost_usd", "cost USD"),
)

Number = int | float


@dataclass(frozen=True)
class Price:
    """A model's price: USD per one million prompt tokens and per one million completion tokens."""

    prompt_per_1m: float
    completion_per_1m: float


#: Model name -> price; ``"*"`` (:data:`FALLBACK_MODEL`) prices every model not named.
PriceTable = Mapping[str, Price]


@dataclass(frozen=True)
class Usage:
    """The model calls of a run (or of many): count, latencies, tokens and cost (see the module docstring)."""

    calls: int = 0
    latencies_ms: tuple[float, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    unpriced_models: tuple[str, ...] = ()
    calls_by_model: tuple[tuple[str, int], ...] = ()  # (model, calls), by model name: who answered (fallbacks)

    def calls_to(self, model: str) -> int:
        """How many of the calls ``model`` answered."""
        return dict(self.calls_by_model).get(model, 0)

    @property
    def p50_ms(self) -> float | None:
        """The median latency (nearest rank), or ``None`` without latencies."""
        return percentile(self.latencies_ms, 50)

    @property
    def p95_ms(self) -> float | None:
        """The 95th percentile latency (nearest rank), or ``None`` without latencies."""
        return percentile(self.latencies_ms, 95)

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        by_model = Counter(dict(self.calls_by_model)) + Counter(dict(other.calls_by_model))
        return Usage(self.calls + other.calls, self.latencies_ms + other.latencies_ms,
                     self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                     cost, tuple(sorted({*self.unpriced_models, *other.unpriced_models})),
                     tuple(sorted(by_model.items())))

    def metrics(self) -> dict[str, Number | None]:
        """The :data:`METRICS`, by name."""
        return {"model_calls": self.calls, "latency_p50_ms": self.p50_ms, "latency_p95_ms": self.p95_ms,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost_usd": self.cost_usd}

    def to_json(self) -> dict[str, Any]:
        """The metrics and the models without a price, as plain JSON values."""
        return {**self.metrics(), "unpriced_models": list(self.unpriced_models),
                "calls_by_model": dict(self.calls_by_model)}


@dataclass(frozen=True)
class UsageComparison:
    """Production's usage against the replay's, for one run or for a whole report."""

    production: Usage
    replay: Usage

    @property
    def has_model_calls(self) -> bool:
        """Whether either side made a model call."""
        return bool(self.production.calls or self.replay.calls)

    def delta(self) -> dict[str, Number | None]:
        """``replay - production`` per metric; ``None`` where either side is unknown."""
        before, after = self.production.metrics(), self.replay.metrics()
        return {name: _difference(before[name], after[name]) for name, _ in METRICS}

    def delta_percent(self) -> dict[str, float | None]:
        """The delta in percent of production's value; ``None`` where that value is zero or unknown."""
        before, after = self.production.metrics(), self.replay.metrics()
        return {name: _percent(before[name], after[name]) for name, _ in METRICS}

    def to_json(self) -> dict[str, Any]:
        """Both usages and the deltas, as plain JSON values."""
        return {"production": self.production.to_json(), "replay": self.replay.to_json(),
                "delta": self.delta(), "delta_percent": self.delta_percent()}


def usage_of(calls: Iterable[CallRecord], prices: PriceTable | None = None) -> Usage:
    """The :class:`Usage` of the model calls among ``calls``, priced with ``prices`` (``None``: no prices)."""
    total = Usage()
    for call in calls:
        meta = getattr(call, "meta", None) or {}
        if "model" in meta:
            total += _call_usage(meta, prices)
    return total


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``values``: the ``ceil(p / 100 * n)``-th smallest,
    or ``None`` when ``values`` is empty. E.g. of 1..10, p50 is 5 and p95 is 10."""
    if not 0 < p <= 100:
        raise ValueError(f"a percentile is in (0, 100], not {p}")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1]


def price_for(prices: PriceTable | None, model: str) -> Price | None:
    """The price of ``model``: its own entry, else the ``"*"`` entry, else ``None``."""
    if not prices:
        return None
    return prices.get(model, prices.get(FALLBACK_MODEL))


def call_cost(price: Price, prompt_tokens: int, completion_tokens: int) -> float:
    """USD of one call: tokens times the price per million, prompt and completion."""
    return (prompt_tokens * price.prompt_per_1m + completion_tokens * price.completion_per_1m) / 1_000_000


def _call_usage(meta: Mapping[str, Any], prices: PriceTable | None) -> Usage:
    model = str(meta["model"])
    prompt, completion = _count(meta.get("prompt_tokens")), _count(meta.get("completion_tokens"))
    latency = meta.get("latency_ms")
    latencies = (float(latency),) if _is_number(latency) else ()
    price = price_for(prices, model)
    if price is None:
        return Usage(1, latencies, prompt, completion, None, (model,), ((model, 1),))
    return Usage(1, latencies, prompt, completion, call_cost(price, prompt, completion), (), ((model, 1),))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> int:
    return int(value) if _is_number(value) else 0


def _difference(before: Number | None, after: Number | None) -> Number | None:
    return None if before is None or after is None else after - before


def _percent(before: Number | None, after: Number | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return (after - before) / before * 100
