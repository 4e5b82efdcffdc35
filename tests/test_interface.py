"""The engine's public interface (``multigpu/__init__.py``): every name it lists resolves, the version is the one the
changelog and the installed distribution give, and importing the package alone imports nothing heavy."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import multigpu
from tests.conftest import REPO, cli_env


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in multigpu.__all__:
        value = getattr(multigpu, name)
        assert value is not None, name
    assert multigpu.TemplateCLI.__module__ == "multigpu.run.cli"
    assert multigpu.ConfigurationError.__module__ == "multigpu.errors"


def test_the_failure_helpers_are_the_failures_modules_and_errors_holds_the_errors_alone():
    """2.0 dropped their 1.x path through ``multigpu.errors`` (CHANGELOG.md), which imported ``failures`` back."""
    import multigpu.errors
    import multigpu.errors.failures

    for name in ("FILE_SYSTEM_ERRNOS", "file_system_failure", "network_failure", "is_network_error"):
        assert getattr(multigpu, name) is getattr(multigpu.errors.failures, name)
        assert not hasattr(multigpu.errors, name), name


def test_an_unknown_name_is_an_attribute_error():
    try:
        multigpu.NoSuchThing  # noqa: B018
    except AttributeError as error:
        assert "NoSuchThing" in str(error)
    else:
        raise AssertionError("multigpu.NoSuchThing resolved")


def test_the_version_is_semantic_and_the_changelogs_and_the_installed_ones():
    assert re.fullmatch(r"\d+\.\d+\.\d+", multigpu.__version__)
    newest = re.search(r"^## (\d+\.\d+\.\d+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert newest is not None and newest.group(1) == multigpu.__version__
    assert importlib.metadata.version("lightning-multigpu") == multigpu.__version__


def test_importing_the_package_imports_neither_torch_nor_lightning():
    probe = "import sys, multigpu; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
