"""CHANGELOG.md: its newest section is this version's and names the current version of every persisted format, so
that a format bump without a CHANGELOG line fails here.

Each format version is written in the section as ``NAME = value`` in backticks, for example ``STATE_VERSION = 2``.
Record schema versions go on the line that names their table (``JOURNAL_SCHEMAS``, ``CAPTURE_SCHEMAS``), as
``kind = version``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import flink_agents_replay
from flink_agents_replay.flink.signals import SIGNAL_VERSION
from flink_agents_replay.jobs.kafka_input import DEAD_LETTER_VERSION
from flink_agents_replay.jobs.waits_topic import WAIT_EVENT_VERSION
from flink_agents_replay.longterm import versions as longterm_versions
from flink_agents_replay.storage.capture.manifest import MANIFEST_VERSION
from flink_agents_replay.storage.capture.schemas import CAPTURE_SCHEMAS
from flink_agents_replay.storage.formats.state import STATE_VERSION
from flink_agents_replay.storage.journal.fence_watch import FENCE_RECORD_VERSION
from flink_agents_replay.storage.journal.fencing import FENCING_MARKER_VERSION
from flink_agents_replay.storage.journal.markers import MARKER_VERSION
from flink_agents_replay.storage.journal.transfer import DUMP_VERSION
from flink_agents_replay.storage.records import chat, raised, waits
from flink_agents_replay.storage.records.codec import FORMAT_VERSION, READABLE_VERSIONS
from flink_agents_replay.storage.records.schemas import JOURNAL_SCHEMAS

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
_SECTION = re.compile(r"^## (\S+)", re.MULTILINE)
_ENTRY = re.compile(r"`(\w+) = (\d+)`")

#: What the newest section must say, as ``NAME = value``, for each persisted format version in the code.
FORMAT_VERSIONS = {
    "FORMAT_VERSION": FORMAT_VERSION,  # record envelope (journal and capture topics)
    "READABLE_VERSIONS": READABLE_VERSIONS,  # envelopes still read: dropping one is a compatibility change
    "FENCING_MARKER_VERSION": FENCING_MARKER_VERSION,  # attempt records' payload "version"
    "FENCE_RECORD_VERSION": FENCE_RECORD_VERSION,  # a start's record in the journal's fence topic
    "STATE_VERSION": STATE_VERSION,  # keyed state entries
    "MARKER_VERSION": MARKER_VERSION,  # checkpoint markers (union operator state)
    "MANIFEST_VERSION": MANIFEST_VERSION,  # capture manifest entries
    "lm_schema": longterm_versions.SCHEMA,  # long-term memory documents' metadata field
    "DUMP_VERSION": DUMP_VERSION,  # `journal dump` files
    "DEAD_LETTER_VERSION": DEAD_LETTER_VERSION,  # the packaged jobs' dead-letter records
    "WAIT_EVENT_VERSION": WAIT_EVENT_VERSION,  # the packaged job's wait events
    "SIGNAL_VERSION": SIGNAL_VERSION,  # decisions as sent to the signals topic
    # Module-private, but persisted inside call records all the same.
    "chat._SCHEMA": chat._SCHEMA,  # a chat model's answer
    "raised._VERSION": raised._VERSION,  # an exception kept as its parts
    "waits._SCHEMA": waits._SCHEMA,  # a wait and its decision
}


def _newest_section() -> tuple[str, str]:
    """The version of CHANGELOG.md's first ``## <version>`` section, and that section's text."""
    text = CHANGELOG.read_text(encoding="utf-8")
    sections = list(_SECTION.finditer(text))
    assert sections, "CHANGELOG.md has no '## <version>' section"
    end = sections[1].start() if len(sections) > 1 else len(text)
    return sections[0].group(1), text[sections[0].end():end]


def test_the_newest_section_is_this_version():
    version, _ = _newest_section()
    assert version == flink_agents_replay.__version__, (
        f"CHANGELOG.md's first section is {version}, the package is {flink_agents_replay.__version__}")


@pytest.mark.parametrize(("name", "value"), FORMAT_VERSIONS.items(), ids=list(FORMAT_VERSIONS))
def test_the_newest_section_names_each_format_version(name, value):
    version, section = _newest_section()
    assert f"`{name} = {value!r}`" in section, (
        f"CHANGELOG.md's section {version} does not say `{name} = {value!r}`: a persisted format changed, say so")


@pytest.mark.parametrize(("table", "schemas"), [("JOURNAL_SCHEMAS", JOURNAL_SCHEMAS),
                                                ("CAPTURE_SCHEMAS", CAPTURE_SCHEMAS)])
def test_the_newest_section_names_each_record_schema_version(table, schemas):
    version, section = _newest_section()
    lines = [line for line in _items(section) if f"`{table}`" in line]
    assert len(lines) == 1, f"CHANGELOG.md's section {version} needs one line naming `{table}`"
    named = {kind: int(number) for kind, number in _ENTRY.findall(lines[0])}
    assert named == {kind: schema.version for kind, schema in schemas.items()}, (
        f"CHANGELOG.md's section {version} lists other `{table}` versions than the code: a record schema changed")


def _items(section: str) -> list[str]:
    """The section's list items, each joined with its continuation lines."""
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line)
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
    return items
