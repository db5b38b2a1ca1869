"""Word-level highlighting of two texts, for the HTML replay report (:mod:`.diff`).

The texts are cut into tokens: words (runs of letters, digits and ``_``), runs of whitespace, and single
punctuation characters; joined, the tokens give back the text exactly. :class:`difflib.SequenceMatcher`
(``autojunk`` off, so frequent tokens such as spaces and quotes still match) lines the two token lists up.
Tokens only the old text has are wrapped in ``<del>``, tokens only the new text has in ``<ins>``; a run of
whitespace and punctuation between two changes joins them, so "have noted" -> "are sorry for" reads as one
change rather than a word-by-word patchwork. Every token is HTML-escaped; the fragments are meant to go
inside a ``<pre>``.

The matcher's time grows with the product of the two token counts: the common start and end are set aside
first, and a differing middle of more than :data:`MAX_TOKEN_PAIRS` pairs is marked as one change.
"""

from __future__ import annotations

import difflib
import html
import os
import re

__all__ = ["MAX_TOKEN_PAIRS", "highlight_words", "tokenize"]

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
_WORD = re.compile(r"\w")


def tokenize(text: str) -> list[str]:
    """``text`` as words, whitespace runs and punctuation characters; ``"".join(tokenize(t)) == t``."""
    return _TOKEN.findall(text)


def highlight_words(old: str, new: str) -> tuple[str, str]:
    """HTML fragments of ``old`` with its removed words in ``<del>`` and of ``new`` with its inserted words in
    ``<ins>``; identical texts come back escaped and unmarked."""
    before, after = tokenize(old), tokenize(new)
    old_html: list[str] = []
    new_html: list[str] = []
    for tag, i1, i2, j1, j2 in _join_changes(_opcodes(before, after), before):
        removed, inserted = _escape(before[i1:i2]), _escape(after[j1:j2])
        if tag == "equal":
            old_html.append(removed)
            new_html.append(inserted)
            continue
        if removed:
            old_html.append(f"<del>{removed}</del>")
        if inserted:
            new_html.append(f"<ins>{inserted}</ins>")
    return "".join(old_html), "".join(new_html)


_Opcode = tuple[str, int, int, int, int]

#: Above this many token pairs (old tokens times new tokens, once the common start and end are set aside),
#: the differing middle is marked as one change: the matcher's time grows with that product.
MAX_TOKEN_PAIRS = 2_000_000


def _opcodes(before: list[str], after: list[str]) -> list[_Opcode]:
    """The matcher's opcodes, over the tokens between the texts' common start and common end."""
    start = len(os.path.commonprefix([before, after]))
    end = len(os.path.commonprefix([before[start:][::-1], after[start:][::-1]]))
    old_end, new_end = len(before) - end, len(after) - end
    if (old_end - start) * (new_end - start) > MAX_TOKEN_PAIRS:
        middle: list[_Opcode] = [("replace", 0, old_end - start, 0, new_end - start)]
    else:
        middle = difflib.SequenceMatcher(None, before[start:old_end], after[start:new_end],
                                         autojunk=False).get_opcodes()
    shifted = [(tag, i1 + start, i2 + start, j1 + start, j2 + start) for tag, i1, i2, j1, j2 in middle]
    head: list[_Opcode] = [("equal", 0, start, 0, start)] if start else []
    tail: list[_Opcode] = [("equal", old_end, len(before), new_end, len(after))] if end else []
    return _merge_equal(head + shifted + tail)


def _merge_equal(opcodes: list[_Opcode]) -> list[_Opcode]:
    """Adjacent equal runs (the common start or end next to the matcher's own) as one."""
    merged: list[_Opcode] = []
    for opcode in opcodes:
        if merged and opcode[0] == "equal" and merged[-1][0] == "equal":
            merged[-1] = ("equal", merged[-1][1], opcode[2], merged[-1][3], opcode[4])
        else:
            merged.append(opcode)
    return merged


def _join_changes(opcodes: list[_Opcode], before: list[str]) -> list[_Opcode]:
    """The opcodes with every change, and every equal run of separators between two changes, merged into one
    ``"replace"``."""
    joined: list[_Opcode] = []
    for index, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        between_changes = 0 < index < len(opcodes) - 1 and all(not _is_word(t) for t in before[i1:i2])
        if tag == "equal" and not between_changes:
            joined.append((tag, i1, i2, j1, j2))
        elif joined and joined[-1][0] != "equal":
            joined[-1] = ("replace", joined[-1][1], i2, joined[-1][3], j2)
        else:
            joined.append(("replace", i1, i2, j1, j2))
    return joined


def _is_word(token: str) -> bool:
    return bool(_WORD.match(token))


def _escape(tokens: list[str]) -> str:
    return html.escape("".join(tokens), quote=True)
