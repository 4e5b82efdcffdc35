"""Projects that ``copier copy`` makes from this repository, made once per session from a scratch clone of it.

The clone holds the working tree as it is, uncommitted changes included, in a commit of its own: the generated
projects name that commit as their engine's source (``pip install`` can resolve it), and no test ever commits or
tags in this repository. Copier and git run as commands, offline, with an identity of their own (CI's machine has
no git configuration).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("stub", "image", "gpt")
#: git's identity and nothing of the machine's configuration (commit signing, hooks, templates)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Template Tests",
    "GIT_AUTHOR_EMAIL": "template-tests@example.invalid",
    "GIT_COMMITTER_NAME": "Template Tests",
    "GIT_COMMITTER_EMAIL": "template-tests@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
#: what a generated project's commands must not inherit from this suite: its pytest, its import path, a job's ranks
INHERITED = ("PYTEST_", "PYTHONPATH", "SLURM_", "PL_", "COV_")


def env(**extra: str) -> dict[str, str]:
    """The environment of a command about a generated project: this interpreter's scripts first on PATH (``python``,
    ``copier``), git's identity, none of this suite's own settings."""
    result = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    result["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), result.get("PATH", "")])
    return {**result, **GIT_ENV, **extra}


def run(*command: str | Path, cwd: Path, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` in ``cwd``; with ``check`` a non-zero exit fails the test with its output."""
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def git(*args: str | Path, cwd: Path) -> str:
    return run("git", *args, cwd=cwd).stdout.strip()


def copier(*args: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """``copier ARGS`` as a user runs it (its command, this interpreter's installation)."""
    return run(sys.executable, "-m", "copier", *args, cwd=cwd, check=check)


def generate(template: Path, destination: Path, *answers: str, vcs_ref: str | None = None) -> Path:
    """``copier copy --defaults`` of ``template`` (at ``vcs_ref``) into ``destination``, ``answers`` given
    (``key=value``)."""
    ref = [f"--vcs-ref={vcs_ref}"] if vcs_ref else []
    data = [f"--data={answer}" for answer in answers]
    copier("copy", "--defaults", "--quiet", *ref, *data, template, destination, cwd=destination.parent)
    return destination


def clone_of_the_working_tree(destination: Path) -> Path:
    """A clone of this repository whose last commit holds its working tree as it is (what git does not ignore)."""
    git("clone", "--quiet", "--no-checkout", REPO, destination, cwd=destination.parent)  # an empty index
    run("git", f"--git-dir={destination / '.git'}", f"--work-tree={REPO}", "add", "--all", cwd=destination)
    git("commit", "--quiet", "--allow-empty", "--no-verify", "-m", "The working tree, for the tests", cwd=destination)
    git("reset", "--quiet", "--hard", cwd=destination)  # the clone's files: the commit's
    return destination


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scratch clone the projects are generated from: a path, as ``copier copy /path/to/checkout`` takes."""
    return clone_of_the_working_tree(tmp_path_factory.mktemp("template") / "lightning-multigpu")


@pytest.fixture(scope="session")
def projects(template_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One project per workload, every other question at its default."""
    folder = tmp_path_factory.mktemp("projects")
    return {name: generate(template_repo, folder / f"my-{name}", f"workload={name}") for name in WORKLOADS}
