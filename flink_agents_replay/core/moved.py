"""Where each module of 0.5.1 lives now: the import paths of 0.5.1 keep working until 0.8.0, and fingerprints
keep naming package objects by their 0.5.1 modules for good.

0.6.0 regrouped the package by layer (``core``, ``integrations``, ``storage``, ``api``, ``engine``, ``flink``...;
see docs/design.md §2). A user's ``from flink_agents_replay.agent import Agent`` or
``import flink_agents_replay.journal.writer`` still works: :class:`OldPathFinder`, which the package installs when
it is imported, answers each old path with the module that holds the code now. It hands out *the same module
object*, not a copy, so each class exists once, ``isinstance`` checks hold, monkeypatching through an old path
patches the real module, and a pickle that names an old path loads. One exception: ``resources``, whose
``ChatModel`` now lives elsewhere, is a read-only view of its two new homes. The first import of an old path warns
with a ``DeprecationWarning`` that names the new one.

Action fingerprints put the module of a package object an action holds (``SideEffects.NONE`` as a default,
``OutputEvent`` in a closure) into the fingerprint. :func:`module_in_0_5_1` maps a module back to its 0.5.1 name,
so that moving the code changes no fingerprint and completions journaled under 0.5.1 still match. That mapping
stays after the aliases go.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any

__all__ = ["MOVED_IN_0_6_0", "OldPathFinder", "install_old_paths", "module_in_0_5_1", "warn_moved"]

PACKAGE = "flink_agents_replay"

#: Each module or package of 0.5.1 that moved in 0.6.0 (names below the package) -> its module now.
MOVED_IN_0_6_0: dict[str, str] = {
    "agent":                            "api.agent",
    "call_site":                        "api.call_site",
    "capture":                          "storage.capture",
    "capture.manifest":                 "storage.capture.manifest",
    "capture.observer":                 "flink.capture_observer",
    "capture.reader":                   "storage.capture.reader",
    "capture.records":                  "storage.capture.records",
    "capture.schemas":                  "storage.capture.schemas",
    "capture.writer":                   "storage.capture.writer",
    "chat_model":                       "api.chat_model",
    "checkpoint_bridge":                "flink.checkpoint_bridge",
    "checkpoint_bridge.build":          "flink.checkpoint_bridge.build",
    "checkpoint_bridge.compile_jar":    "flink.checkpoint_bridge.compile_jar",
    "checkpoint_bridge.wakeups":        "flink.checkpoint_bridge.wakeups",
    "checkpoint_bridge.wiring":         "flink.checkpoint_bridge.wiring",
    "child_pool":                       "engine.child_pool",
    "config":                           "flink.config",
    "demo":                             "cli.demo",
    "digest":                           "engine.digest",
    "engine.history":                   "storage.journal.history",
    "errors":                           "core.errors",
    "events":                           "core.events",
    "flink_env":                        "flink.env",
    "formats":                          "storage.formats",
    "formats.dataclass_sentinels":      "storage.formats.dataclass_sentinels",
    "formats.events":                   "storage.formats.events",
    "formats.exceptions":               "storage.formats.exceptions",
    "formats.legacy":                   "storage.formats.legacy",
    "formats.package_values":           "storage.formats.package_values",
    "formats.plain":                    "storage.formats.plain",
    "formats.schema":                   "storage.formats.schema",
    "formats.state":                    "storage.formats.state",
    "home":                             "core.home",
    "inspect_journal":                  "storage.journal.inspect",
    "journal":                          "storage.journal",
    "journal.attempts":                 "storage.journal.attempts",
    "journal.checkpoints":              "storage.journal.checkpoints",
    "journal.fencing":                  "storage.journal.fencing",
    "journal.index":                    "storage.journal.index",
    "journal.kafka_store":              "storage.journal.kafka_store",
    "journal.markers":                  "storage.journal.markers",
    "journal.memory_store":             "storage.journal.memory_store",
    "journal.recovery":                 "storage.journal.recovery",
    "journal.store":                    "storage.journal.store",
    "journal.transfer":                 "storage.journal.transfer",
    "journal.writer":                   "storage.journal.writer",
    "kafka":                            "integrations.kafka",
    "kafka.admin":                      "integrations.kafka.admin",
    "kafka.settings":                   "integrations.kafka.settings",
    "kafka.store":                      "integrations.kafka.store",
    "kafka.topics":                     "integrations.kafka.topics",
    "kafka_topics":                     "integrations.kafka.admin",
    "keygroups":                        "core.keygroups",
    "longterm.chroma_store":            "integrations.chroma",
    "longterm.store":                   "integrations.vector_store",
    "memory":                           "api.memory",
    "openai_client":                    "integrations.openai_client",
    "operator":                         "flink.operator",
    "pipeline":                         "flink.pipeline",
    "records":                          "storage.records",
    "records.chat":                     "storage.records.chat",
    "records.codec":                    "storage.records.codec",
    "records.journal":                  "storage.records.journal",
    "records.raised":                   "storage.records.raised",
    "records.schemas":                  "storage.records.schemas",
    "resources":                        "api.resources",
    "runtime_info":                     "flink.runtime_info",
    "tool_loop":                        "api.tool_loop",
    "tools":                            "api.tools",
}

#: Modules that left a package which moved as a whole, under the package's new name: ``from
#: flink_agents_replay.capture import observer`` asks the import system for ``storage.capture.observer``.
_LEFT_THEIR_PACKAGE = {f"{MOVED_IN_0_6_0[old.rpartition('.')[0]]}.{old.rpartition('.')[2]}": old
                       for old, new in MOVED_IN_0_6_0.items() if old.rpartition(".")[0] in MOVED_IN_0_6_0
                       and not new.startswith(MOVED_IN_0_6_0[old.rpartition(".")[0]] + ".")}

#: Names a 0.5.1 module offered that now live in another module than the rest of it.
_ALSO_FROM: dict[str, tuple[str, tuple[str, ...]]] = {"resources": ("api.chat_model", ("ChatModel",))}
#: 0.5.1 modules whose code went into a module that holds other code too: no reverse mapping.
_MERGED = frozenset({"kafka_topics"})
#: Modules made in 0.6.0 of a 0.5.1 module's code, without an alias of their own.
_SPLIT_FROM = {"api.tool_schema": "tools"}
_NAME_IN_0_5_1 = {**{f"{PACKAGE}.{new}": f"{PACKAGE}.{old}" for old, new in MOVED_IN_0_6_0.items()
                     if old not in _MERGED},
                  **{f"{PACKAGE}.{new}": f"{PACKAGE}.{old}" for new, old in _SPLIT_FROM.items()}}


def module_in_0_5_1(module: str | None) -> str | None:
    """The name ``module`` had in 0.5.1 (itself, if it did not move)."""
    return _NAME_IN_0_5_1.get(module, module) if module else module


def _moved_to(old: str) -> str | None:
    """The module an old name (below the package) imports as now: its table entry, or for a name inside a moved
    package (one 0.5.1 did not have, like ``journal.history``), that name inside the package's new place, so that
    no module is ever loaded twice under two names."""
    if old in MOVED_IN_0_6_0:
        return MOVED_IN_0_6_0[old]
    if old in _LEFT_THEIR_PACKAGE:
        return MOVED_IN_0_6_0[_LEFT_THEIR_PACKAGE[old]]
    parent, _, leaf = old.rpartition(".")
    return f"{MOVED_IN_0_6_0[parent]}.{leaf}" if parent in MOVED_IN_0_6_0 else None


class OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a 0.5.1 module path as the module that holds its code now (see the module docstring)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        moved = _moved_to(fullname[len(PACKAGE) + 1:]) if fullname.startswith(PACKAGE + ".") else None
        if moved is None:
            return None
        found = importlib.util.find_spec(f"{PACKAGE}.{moved}")  # its file, for python -m (runpy sets __file__)
        return importlib.machinery.ModuleSpec(fullname, self, origin=found.origin if found else None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder: exec_module puts the real module in its place in sys.modules

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m <old path>`` (runpy runs it as ``__main__``)."""
        new = f"{PACKAGE}.{_moved_to(fullname[len(PACKAGE) + 1:])}"
        warn_moved(fullname, new, stacklevel=2)
        return importlib.util.find_spec(new).loader.get_code(new)

    def is_package(self, fullname: str) -> bool:
        return False

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__[len(PACKAGE) + 1:]
        new = f"{PACKAGE}.{_moved_to(old)}"
        real = importlib.import_module(new)  # a name that exists in neither place fails here, as it should
        warn_moved(module.__name__, new, stacklevel=3)
        sys.modules[module.__name__] = _Alias(module.__name__, real, *_ALSO_FROM[old]) if old in _ALSO_FROM \
            else real


def warn_moved(old: str, new: str, *, stacklevel: int) -> None:
    """The deprecation of an old path, naming the 0.5.1 name even when it is reached through a new package."""
    below = old[len(PACKAGE) + 1:]
    shown = f"{PACKAGE}.{_LEFT_THEIR_PACKAGE[below]}" if below in _LEFT_THEIR_PACKAGE else old
    warnings.warn(f"{shown} moved to {new} in flink-agents-replay 0.6.0; the old path goes in 0.8.0",
                  DeprecationWarning, stacklevel=stacklevel)


class _Alias(types.ModuleType):
    """An old module whose names now live in two modules: reads come from ``real``, or from ``other`` for
    ``names``. The one old path that is not the real module, so it refuses writes (a monkeypatch through it would
    change nothing): set the name on the module that holds it. It pickles as its import path."""

    def __init__(self, name: str, real: types.ModuleType, other: str, names: tuple[str, ...]):
        super().__init__(name, real.__doc__)
        fields = {"__all__": [*getattr(real, "__all__", ()), *names], "_places": (real, f"{PACKAGE}.{other}",
                  frozenset(names)), "__spec__": importlib.machinery.ModuleSpec(name, None, origin=real.__file__)}
        self.__dict__.update(fields)

    def _holder(self, name: str) -> types.ModuleType:
        real, other, names = self.__dict__["_places"]
        return importlib.import_module(other) if name in names else real

    def __getattr__(self, name: str) -> Any:  # every name not set on the alias itself
        return getattr(self._holder(name), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__") and name.endswith("__"):  # the import system's own (__spec__, __loader__...)
            self.__dict__[name] = value
            return
        raise AttributeError(f"{self.__name__} is an alias since 0.6.0: set {name} on "
                             f"{self._holder(name).__name__} instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{self.__name__} is an alias since 0.6.0: delete {name} on "
                             f"{self._holder(name).__name__} instead")

    def __dir__(self) -> list[str]:
        real, _, names = self.__dict__["_places"]
        return sorted({*dir(real), *names})

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, (self.__name__,)


def install_old_paths() -> None:
    """Put :class:`OldPathFinder` first on ``sys.meta_path``, once per process."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())
