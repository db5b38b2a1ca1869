"""The 0.5.1 module paths keep working until 0.8.0 (core/moved.py): each old path imports as the very module that
holds the code now, with a warning naming the new path, and every persisted name resolves to where the code lives."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from flink_agents_replay.core.moved import MOVED_IN_0_6_0, module_in_0_5_1
from flink_agents_replay.storage.formats.legacy import V1_NAMES
from flink_agents_replay.storage.formats.package_values import PERSISTED_CLASSES

PACKAGE = "flink_agents_replay"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("old", sorted(MOVED_IN_0_6_0))
def test_an_old_path_is_the_module_that_holds_the_code_now(old: str):
    new = importlib.import_module(f"{PACKAGE}.{MOVED_IN_0_6_0[old]}")
    alias = importlib.import_module(f"{PACKAGE}.{old}")
    if old == "resources":  # also offers ChatModel, which lives in api.chat_model now
        assert alias.Tool is new.Tool and alias.SideEffects is new.SideEffects
        assert alias.ChatModel is importlib.import_module(f"{PACKAGE}.api.chat_model").ChatModel
    else:
        assert alias is new


def test_the_first_import_of_an_old_path_warns_with_the_new_one_and_old_submodules_import_too():
    script = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
              "import flink_agents_replay.storage.journal.writer as new\n"
              "try:\n    import flink_agents_replay.journal.writer\nexcept DeprecationWarning as exc:\n    print(exc)\n"
              "warnings.simplefilter('ignore')\n"
              "import flink_agents_replay.journal.writer as old\n"
              "from flink_agents_replay.agent import Agent\n"
              "from flink_agents_replay.api.agent import Agent as Now\n"
              "print(old is new, Agent is Now)\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "flink_agents_replay.journal moved to flink_agents_replay.storage.journal in flink-agents-replay 0.6.0; "
        "the old path goes in 0.8.0", "True True"]


def test_a_path_that_never_existed_still_fails_to_import():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{PACKAGE}.journal.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{PACKAGE}.no_such_module")


@pytest.mark.parametrize("name", sorted(PERSISTED_CLASSES))
def test_a_persisted_class_target_names_the_module_that_defines_it(name: str):
    module, qualname = PERSISTED_CLASSES[name].split(":")
    assert getattr(importlib.import_module(module), qualname).__module__ == module  # never an alias


def test_the_0_1_0_names_resolve_to_the_modules_that_define_them():
    for (old_module, old_name), (module, name) in V1_NAMES.items():
        assert getattr(importlib.import_module(module), name).__module__ == module, (old_module, old_name)
        assert old_module.startswith(PACKAGE + ".")


def test_fingerprints_name_a_moved_module_by_its_0_5_1_path():
    assert module_in_0_5_1(f"{PACKAGE}.storage.journal.writer") == f"{PACKAGE}.journal.writer"
    assert module_in_0_5_1(f"{PACKAGE}.integrations.kafka.admin") == f"{PACKAGE}.kafka.admin"  # not kafka_topics
    assert module_in_0_5_1(f"{PACKAGE}.api.tool_schema") == f"{PACKAGE}.tools"
    assert module_in_0_5_1("my_agents.triage") == "my_agents.triage"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_module_0_5_1_did_not_have_inside_a_moved_package_is_not_loaded_twice():
    from flink_agents_replay.storage.journal import history

    assert importlib.import_module(f"{PACKAGE}.journal.history") is history  # not a second copy of its classes


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_old_resources_path_refuses_a_patch_it_could_not_apply_and_pickles_as_its_path(monkeypatch):
    import cloudpickle

    from flink_agents_replay.api import resources

    real = resources.current_call_id
    alias = importlib.import_module(f"{PACKAGE}.resources")
    with pytest.raises(AttributeError, match="set current_call_id on flink_agents_replay.api.resources instead"):
        monkeypatch.setattr(alias, "current_call_id", lambda: "patched")
    assert resources.current_call_id is real and alias.current_call_id is real  # nothing changed or deleted
    assert {"ChatModel", "Tool"} <= set(dir(alias))
    assert cloudpickle.loads(cloudpickle.dumps(alias)) is alias  # a 0.5.1 job script's global: by its import path
    assert importlib.util.find_spec(f"{PACKAGE}.resources").name == f"{PACKAGE}.resources"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_old_modules_as_package_attributes_and_from_imports_of_modules_that_left_their_package():
    import flink_agents_replay
    from flink_agents_replay.api import agent
    from flink_agents_replay.capture import observer  # noqa: F401 - capture moved, observer left it
    from flink_agents_replay.flink import capture_observer

    assert flink_agents_replay.agent is agent and observer is capture_observer


def test_python_m_on_an_old_path_runs_the_module_where_it_lives_now_with_a_warning():
    shown = subprocess.run([sys.executable, "-W", "default", "-m", "flink_agents_replay.checkpoint_bridge.build"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr  # the module reads its __file__: it must be set
    assert "checkpoint_bridge.build moved to flink_agents_replay.flink.checkpoint_bridge.build" in shown.stderr


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_deleting_through_the_old_resources_path_is_refused_by_name():
    alias = importlib.import_module(f"{PACKAGE}.resources")
    with pytest.raises(AttributeError, match="delete Tool on flink_agents_replay.api.resources instead"):
        del alias.Tool
