"""What a page shows a person: its DOM once Debian's headless Chromium has run its scripts.

``./run tests`` installs Chromium (``/usr/bin/chromium``) when it is missing. Each call starts a fresh browser
with a user-data directory of its own (no profile, cache or cookie carried over), offline of everything but the
page's own server (no component updates, sync, QUIC or background requests), and ends it with its whole process
group: a run leaves no browser behind.

Why ``--dump-dom`` with ``--virtual-time-budget`` is enough for a React application: virtual time does not advance
while a fetch is pending, so the budget is spent only after the page's data requests have answered and their
renders ran; a page that renders later still (a poll) is read again by :func:`rendered_dom`'s ``expect``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable

__all__ = ["CHROMIUM", "chromium_command", "rendered_dom"]

CHROMIUM = "/usr/bin/chromium"


def chromium_command(url: str, user_data_dir: str, *, budget_ms: int) -> list[str]:
    """The command line that prints ``url``'s DOM after ``budget_ms`` of virtual time."""
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={user_data_dir}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url]


def rendered_dom(url: str, *, timeout_s: float, budget_ms: int = 10_000, expect: Iterable[str] = ()) -> str:
    """The DOM of ``url`` as headless Chromium rendered it (``--dump-dom``, serialized HTML).

    With ``expect``, the page is loaded again (a fresh browser each time) until its DOM holds every one of those
    strings or ``timeout_s`` has passed; the last DOM is returned either way, for the caller's assertion to show.
    A ``TimeoutError`` if no load at all finished within ``timeout_s``.
    """
    if not os.access(CHROMIUM, os.X_OK):
        raise FileNotFoundError(f"{CHROMIUM} is missing: `./run tests` installs it (apt-get install chromium)")
    wanted = list(expect)
    deadline = time.monotonic() + timeout_s
    dom: str | None = None
    while dom is None or not all(text in dom for text in wanted):
        left = deadline - time.monotonic()
        if left <= 0:
            if dom is None:
                raise TimeoutError(f"headless Chromium rendered no DOM of {url} within {timeout_s:.0f} s")
            return dom
        dom = _dump_dom(url, budget_ms=budget_ms, timeout_s=left)
    return dom


def _dump_dom(url: str, *, budget_ms: int, timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        process = subprocess.Popen(chromium_command(url, profile, budget_ms=budget_ms), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as expired:
            _end_group(process)
            process.communicate()  # closes its pipes and reaps it
            raise TimeoutError(f"headless Chromium did not print the DOM of {url} within {timeout_s:.0f} s") \
                from expired
        _end_group(process)  # what the browser left of its process group, if anything
    if process.returncode != 0:
        raise RuntimeError(f"headless Chromium exited with {process.returncode} on {url}:\n"
                           f"{err.decode(errors='replace')[-2000:]}")
    return out.decode(errors="replace")


def _end_group(process: subprocess.Popen) -> None:
    """SIGKILL what is left of the browser's process group (its renderer and utility processes)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
