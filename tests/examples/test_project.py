"""This repository's project (``src/``) on the engine as a generated project is: it imports only the engine's public
interface and no private name of a library, and its command line loads none of its examples unless a config names
them (the engine's own: tests/test_architecture.py, tests/compat/test_compat.py)."""

from __future__ import annotations

import yaml

from multigpu import compat
from tests.compat.test_compat import overridden_hooks, private_reaches, scanned_files
from tests.conftest import REPO
from tests.test_architecture import PUBLIC, imports_of, run_of_a_users_model


def test_the_project_uses_only_the_engines_public_interface():
    graph = imports_of(REPO / "src", "multigpu")
    assert graph.get("src.cli")  # the walk found the project's command line
    private = [f"{a} -> {b}" for a, targets in graph.items() for b in sorted(targets) if b not in PUBLIC]
    assert not private, f"the project imports the engine's own modules: {private}; use `from multigpu import ...`"


def test_a_run_of_a_users_model_imports_none_of_the_examples_and_reads_the_default_config(tmp_path):
    """A project whose default config names its own model and data module (as a generated one does) loads none of
    this repository's examples (they are imported when a config names them, tests/examples/test_gpt.py, not with
    the package), nor ``tune``'s Trainer; jsonargparse alone reads the default config."""
    loaded, opened = run_of_a_users_model("src.cli", tmp_path)
    examples = ["src.models.gpt", "src.models.image_classifier", "src.data.images", "src.data.text", "src.data.corpus"]
    assert not [name for name in [*examples, "multigpu.tuning"] if f"'{name}" in loaded], loaded
    assert "'multigpu.models.base'" in loaded and "'src.cli'" in loaded  # the probe saw the run's modules
    assert 1 <= opened <= 2  # for the subcommand's arguments, and for the environment's


def test_the_project_uses_no_private_name_of_a_library():
    found = private_reaches(scanned_files(REPO / "src"))
    assert not found, "private names in the project (give each a function in multigpu/compat/):\n" + "\n".join(found)


def test_a_protected_hook_the_project_overrides_is_one_compat_lists():
    files = scanned_files(REPO / "src")
    assert len(files) > 5  # the walk found the project
    assert overridden_hooks(files) <= set(compat.OVERRIDDEN_HOOKS)


def test_the_tests_default_config_is_the_projects_with_the_tests_classes():
    """The engine's tests read tests/configs/default.yaml where a project reads its configs/default.yaml: the same
    settings, the tests' model and data module in place of the examples'."""
    project = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    tests = yaml.safe_load((REPO / "tests" / "configs" / "default.yaml").read_text())
    assert {k: v for k, v in tests.items() if k not in ("model", "data")} == {
        k: v for k, v in project.items() if k not in ("model", "data")
    }
    assert project["model"].startswith("src.models.") and tests["model"] == "tests.fixtures.workload.DefaultClassifier"
    assert project["data"].startswith("src.data.") and tests["data"] == "tests.fixtures.workload.DefaultData"
