"""Price tables for the replay diff's cost rows (:mod:`.usage`), from the command line or a JSON file.

* ``MODEL=PROMPT_PER_1M/COMPLETION_PER_1M``: one model's price in USD per one million prompt and completion
  tokens, e.g. ``gpt-4o-mini=0.15/0.60``; ``*=1/2`` prices every model not named otherwise. (The model name
  ends at the last ``=``, so names with ``/`` such as ``openai/gpt-4o`` work.)
* A JSON file: ``{"gpt-4o-mini": {"prompt_per_1m": 0.15, "completion_per_1m": 0.6}, "*": {...}}``.

Prices are finite numbers, zero or more. Anything else is a :class:`~flink_agents_replay.core.errors.ConfigError`
that names the value and the expected form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flink_agents_replay.core.errors import ConfigError
from flink_agents_replay.replay.usage import Price

__all__ = ["load_prices", "parse_price", "price_table", "prices_from_json"]

_PRICE_FORM = "MODEL=PROMPT_PER_1M/COMPLETION_PER_1M (USD per 1M tokens, e.g. gpt-4o-mini=0.15/0.60)"
_NOT_A_PRICE = "is not a price (a number of USD per 1M tokens, zero or more)"
_FILE_FORM = '{"MODEL": {"prompt_per_1m": 0.15, "completion_per_1m": 0.6}, ...}'


def parse_price(text: str) -> tuple[str, Price]:
    """``MODEL=PROMPT_PER_1M/COMPLETION_PER_1M`` as ``(model, Price)``."""
    model, equals, amounts = text.rpartition("=")
    parts = amounts.split("/")
    if not equals or not model.strip() or len(parts) != 2:
        raise ConfigError(f"--price {text!r}: expected {_PRICE_FORM}")
    prompt, completion = (_parsed_amount(part, f"--price {text!r}") for part in parts)
    return model.strip(), Price(prompt, completion)


def prices_from_json(document: Any, where: str = "the price table") -> dict[str, Price]:
    """A decoded JSON price table (see the module docstring) as model -> :class:`Price`."""
    if not isinstance(document, dict):
        raise ConfigError(f"{where}: expected a JSON object {_FILE_FORM}")
    table = {}
    for model, entry in document.items():
        if not isinstance(entry, dict) or set(entry) != {"prompt_per_1m", "completion_per_1m"}:
            raise ConfigError(f"{where}: model {model!r}: expected {{\"prompt_per_1m\": NUMBER, "
                              f"\"completion_per_1m\": NUMBER}}, got {json.dumps(entry)}")
        label = f"{where}: model {model!r}"
        table[model] = Price(_amount(entry["prompt_per_1m"], label), _amount(entry["completion_per_1m"], label))
    return table


def load_prices(path: str | Path) -> dict[str, Price]:
    """The price table of a JSON file."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--prices {str(path)!r}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"--prices {str(path)!r}: not JSON: {exc}") from None
    return prices_from_json(document, f"--prices {str(path)!r}")


def price_table(prices: Iterable[str] = (), prices_file: str | Path | None = None) -> dict[str, Price] | None:
    """The table of ``--prices FILE`` and ``--price`` entries (which override the file's); ``None`` without
    either."""
    entries = list(prices)
    if prices_file is None and not entries:
        return None
    table = load_prices(prices_file) if prices_file is not None else {}
    table.update(parse_price(entry) for entry in entries)
    return table


def _amount(value: Any, where: str) -> float:
    """A price: a finite number, zero or more."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: {value!r} {_NOT_A_PRICE}")
    return float(value)


def _parsed_amount(text: str, where: str) -> float:
    """A price written on the command line."""
    try:
        return _amount(float(text), where)
    except ValueError:  # not a number, or not a price (a ConfigError is a ValueError): name what was written
        raise ConfigError(f"{where}: {text!r} {_NOT_A_PRICE}") from None
