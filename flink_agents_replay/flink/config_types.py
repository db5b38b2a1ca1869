"""The type each agent config setting must have, and its value as the package uses it.

A setting of the wrong type would fail deep inside a running job (``'<' not supported between instances of
'str' and 'int'``), or worse, quietly mean something else (``output_topics="replies"`` is seven one-letter
topics). :func:`normalized_settings` checks every typed setting when the config is resolved and names the one
that is wrong. Values of other numeric types that say the same (a NumPy integer, a NumPy bool, an ``int`` for
seconds) are taken and converted, so what the package keeps and logs is plain Python.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flink_agents_replay.core.errors import ConfigError

__all__ = ["normalized_settings"]


class _Wrong(Exception):
    """The value does not have the setting's type."""


def _whole(value: Any) -> int:
    if isinstance(value, numbers.Integral) and not _is_flag(value):
        return int(value)
    raise _Wrong


def _optional_whole(value: Any) -> int | None:
    return None if value is None else _whole(value)


def _seconds(value: Any) -> float:
    if isinstance(value, numbers.Real) and not _is_flag(value) and not math.isnan(value):
        return float(value)
    raise _Wrong


def _flag(value: Any) -> bool:
    if _is_flag(value):
        return bool(value)
    raise _Wrong


def _is_flag(value: Any) -> bool:
    kind = type(value)
    return kind is bool or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def _optional_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _Wrong


def _mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    raise _Wrong


def _texts(value: Any) -> tuple[str, ...]:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(
            isinstance(item, str) for item in value):
        return tuple(value)
    raise _Wrong


def _text_or_texts(value: Any) -> str | tuple[str, ...] | None:
    return value if value is None or isinstance(value, str) else _texts(value)


#: (settings, conversion, what the message says they must be).
_SETTING_TYPES: tuple[tuple[tuple[str, ...], Callable[[Any], Any], str], ...] = (
    (("max_parallelism", "max_concurrent_runs", "max_concurrent_child_calls", "poll_interval_ms",
      "fallback_check_ms"), _whole, "a whole number"),
    (("max_waiting_inputs", "replication_factor"), _optional_whole, "a whole number or None"),
    (("slot_wait_timeout_s", "close_timeout_s", "ack_timeout_s", "kafka_timeout_s", "order_restore_timeout_s",
      "recovered_history_expiry_s"), _seconds, "a number of seconds"),
    (("journal_enabled", "accept_reexecution_after_gap", "create_topic", "wake_on_completion",
      "restore_input_order", "capture"), _flag, "True or False"),
    (("journal_topic", "uid", "continue_job", "capture_topic"), _optional_text, "a string or None"),
    (("kafka", "topic_config", "capture_topic_config"), _mapping, "a dict"),
    (("output_topics",), _texts, "a list of topic names (a list, not one string)"),
    (("accept_moved_journal_from",), _text_or_texts, "a topic id, a list of them, or None"),
)


def normalized_settings(config: Any) -> dict[str, Any]:
    """Each typed setting of ``config`` as the package uses it; :class:`ConfigError` naming the first that does
    not have its type, what it must be and what it is."""
    values = {}
    for names, convert, expected in _SETTING_TYPES:
        for name in names:
            value = getattr(config, name)
            try:
                values[name] = convert(value)
            except _Wrong:
                raise ConfigError(f"{name} must be {expected}, got {value!r} ({_type_name(value)})") from None
    return values


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
