"""Writes the reference pages made from the code, so that they cannot drift from it:

* ``docs/settings.md`` from :class:`~flink_agents_replay.flink.config.AgentConfig` (its fields, defaults and
  docstring) and the types its checks take (``_TypedSettings``);
* ``docs/metrics.md`` from :mod:`flink_agents_replay.flink.metrics` and the packaged jobs' metric.

``python docs/generate.py`` writes them; ``--check`` exits 1 if a page is not what the code makes
(``tests/unit/test_docs.py`` runs that check).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
GENERATED = "<!-- Made by docs/generate.py from the code; edit the code, then run it. -->"


def _attributes(doc: str) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section, continuation lines joined."""
    section = inspect.cleandoc(doc).split("Attributes:\n", 1)[1]
    found: dict[str, str] = {}
    last = None
    for line in section.splitlines():
        entry = re.match(r"^    (\w+): (.*)$", line)
        if entry:
            last = entry.group(1)
            found[last] = entry.group(2).strip()
        elif line.startswith("        ") and last is not None:
            found[last] += " " + line.strip()
    return found


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    value = getattr(value, "value", value)  # an enum member as what one writes
    return "" if value in ("", None) and field.name != "max_waiting_inputs" else f"`{value!r}`"


def _markdown(text: str) -> str:
    """reStructuredText roles and literals of a docstring as Markdown code; table pipes escaped."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return text.replace("|", "\\|")


def _kind(name: str) -> str:
    """What a setting takes, for those the type checks do not describe."""
    from flink_agents_replay.engine import FingerprintPolicy
    from flink_agents_replay.flink.config import _TypedSettings
    from flink_agents_replay.storage.journal.writer import Durability

    checked = _TypedSettings.model_fields.get(name)
    if checked is not None:
        return checked.description
    choices = {"durability": Durability, "fingerprint_policy": FingerprintPolicy}.get(name)
    if choices is not None:
        return " or ".join(f"`{choice.value}`" for choice in choices)
    return {"replay": "set by the replay job",
            "tracing": "True, a `TracingConfig` (or a dict of its settings), or None"}[name]


def settings_page() -> str:
    from flink_agents_replay.flink.config import AgentConfig

    meanings = _attributes(AgentConfig.__doc__ or "")
    rows = []
    for field in dataclasses.fields(AgentConfig):
        kind, meaning = _kind(field.name), _markdown(meanings[field.name])
        rows.append(f"| `{field.name}` | {kind} | {_default(field)} | {meaning} |")
    return "\n".join([
        GENERATED, "", "# Settings reference", "",
        "The fields of `AgentConfig` (`flink_agents_replay.AgentConfig`), also accepted as the keys of a plain dict",
        "by `connect_to_agent` and `AgentConfig.from_mapping`. Every setting is checked when the config is resolved",
        "(in `connect_to_agent`, before a job is submitted): a wrong type or a value out of its limits is a",
        "`ConfigError` that names the setting, what it must be and what it got. An empty default is `None`.", "",
        "| setting | what it takes | default | what it does |", "|---|---|---|---|", *rows, ""])


def metrics_page() -> str:
    from flink_agents_replay.flink.metrics import COUNTERS, GROUP, VALUES
    from flink_agents_replay.jobs.kafka_input import DEAD_LETTER_METRIC

    rows = [f"| `{name}` | counter | {text} |" for name, text in COUNTERS.items()]
    rows += [f"| `{name}` | value | {text} |" for name, text in VALUES.items()]
    return "\n".join([
        GENERATED, "", "# Metrics", "",
        f"The agent operator's metrics are in its metric group `{GROUP}`, per subtask, through Flink's metric",
        "system (any reporter: Prometheus, JMX, the REST API). Counters count since the subtask started; a value is a",
        "counter that holds a value (Python gauges crash thread-mode TaskManagers).", "",
        "| metric | kind | what it counts |", "|---|---|---|", *rows, "",
        "The packaged jobs' parse operator counts the records sent to the dead-letter topic in "
        f"`{DEAD_LETTER_METRIC}`.", ""])


PAGES = {"settings.md": settings_page, "metrics.md": metrics_page}


def main(argv: list[str]) -> int:
    stale = []
    for name, make in PAGES.items():
        text = make()
        if "--check" in argv:
            if not (DOCS / name).exists() or (DOCS / name).read_text() != text:
                stale.append(name)
        else:
            (DOCS / name).write_text(text)
    if stale:
        print(f"not what the code makes: {', '.join(f'docs/{n}' for n in stale)}; run python docs/generate.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
