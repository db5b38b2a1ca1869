"""The build backend: setuptools, plus the pinned PyFlink's jars when a wheel is built.

A wheel carries the checkpoint bridge jar, compiled by ``setup.py``'s build hook against the jars of the
``apache-flink-libraries`` distribution of the pinned ``apache-flink`` (read from ``pyproject.toml``, so the pin
lives in one place). Only wheel builds need it (and a JDK); sdists and editable installs do not.
"""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403  (the backend's hooks, re-exported)


def _flink_libraries() -> str:
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    pin = re.search(r'"apache-flink==([^"\s]+)"', pyproject)
    if pin is None:
        raise RuntimeError("pyproject.toml must pin apache-flink (\"apache-flink==X.Y.Z\")")
    return f"apache-flink-libraries=={pin.group(1)}"


def get_requires_for_build_wheel(config_settings=None):
    return [*build_meta.get_requires_for_build_wheel(config_settings), _flink_libraries()]
