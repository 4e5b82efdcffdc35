"""Shared fixtures: run the CLI in-process or in a subprocess, tiny workloads, checkpoint comparisons."""

from __future__ import annotations

import atexit
import contextlib
import csv
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import lightning.pytorch  # noqa: F401 (imported first: see pytest_runtest_teardown)
import pytest
import torch

from multigpu.testing import Project, relative_difference  # noqa: F401 (the suite's tests import it from here)
from tests import prewarmed

REPO = Path(__file__).resolve().parents[1]

# One compute thread per process, in the pytest-xdist workers and every process a test starts: with one worker
# per core, a second thread per process only oversubscribes the cores (OpenMP's threads spin while they wait).
# Measured on 2 cores: the README's bare fit took 137 s of CPU time in the suite with 2 threads, 82 s with one.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Every in-process run sets this (multigpu.run.cli.run_cli); set from the start, the worker's environment is the same
# before and after one, so the prewarmed server (started with it) still serves the commands started after it.
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

#: the command line the tests of the engine run (tests/cli.py: the engine's, with the tests' own default config)
CLI_MODULE = "tests.cli"


@functools.cache
def project_folder() -> Path:
    """A folder that is a project to ``multigpu.command``: its ``pyproject.toml`` names the tests' command line
    (``[tool.multigpu] cli``), and this repository's ``slurm/`` and ``tests/`` are linked in. A command that reads
    the project's command line from the folder it runs in (``python -m multigpu.sweep``, slurm/sweep.sbatch) runs
    from here, so that its trials run ``python -m tests.cli`` (one folder per process of the tests)."""
    folder = Path(tempfile.mkdtemp(prefix="tests-project-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "pyproject.toml").write_text(f'[tool.multigpu]\ncli = "{CLI_MODULE}"\n')
    for name in ("slurm", "tests", ".venv"):
        if (REPO / name).exists():
            (folder / name).symlink_to(REPO / name)
    return folder


#: the tests' own workload and settings (tests/fixtures/workload.py, tests/configs/tiny.yaml): the tests of the
#: template's machinery use it, so they pass whatever a default config names
TINY_CONFIG = REPO / "tests" / "configs" / "tiny.yaml"
TINY = ["--config", str(TINY_CONFIG)]
#: the workload with one validation batch
TINY_RUN = [*TINY, "--trainer.limit_val_batches=1"]


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a CLI subprocess: the repo importable, one thread per process (above), quiet, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PL_", "WANDB_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONWARNINGS="ignore::DeprecationWarning",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
    )
    env.update(extra)
    return env


prewarmed.server_environment = cli_env  # the server of tests/prewarmed.py imports as most commands would


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one pytest-xdist worker per core, and one more. Much of a multi-process test is waiting (for a
    SLURM job, a collective timeout, a rank's start-up): measured on 2 cores, the suite kept the cores 96% busy
    with 3 workers and took 10% less time than with 2 (1013 s against 1130 s)."""
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The SLURM tests share one small cluster: one pytest-xdist worker runs them all, one job after another.

    A plain ``python -m pytest`` (no test named, no ``-m``) leaves out the tests marked ``extended``: more cases of
    guarantees that the rest proves at least once each, and the template's own workflows in fresh environments.
    ``python -m pytest -m extended`` runs them, as CI does after the rest; naming a file or folder runs all of its.
    """
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if leaves_out_extended(config):
        extended = [item for item in items if item.get_closest_marker("extended")]
        config.hook.pytest_deselected(items=extended)
        items[:] = [item for item in items if not item.get_closest_marker("extended")]


def leaves_out_extended(config: pytest.Config) -> bool:
    """A plain ``python -m pytest``: no ``-m``, no test named (a pytest-xdist worker is handed the same)."""
    return not config.option.markexpr and config.args_source is pytest.Config.ArgsSource.TESTPATHS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if leaves_out_extended(config):
        terminalreporter.write_line("left out: the tests marked extended (python -m pytest -m extended; CI runs both)")
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.write_line(f"the tests wrote into the checkout (give them tmp_path): {written}", red=True)


def checkout_changes() -> set[str]:
    """``git status`` of the repository's files, ignored ones left out; empty outside a git checkout."""
    try:
        status = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True
        )
    except OSError:  # no git
        return set()
    return set(status.stdout.splitlines()) if status.returncode == 0 else set()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the run's own process, not a pytest-xdist worker
        session.config.stash[_CHECKOUT] = checkout_changes()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run whose tests all passed fails if they wrote into the checkout (said in the summary, which follows)."""
    if _CHECKOUT not in session.config.stash:
        return
    written = sorted(checkout_changes() - session.config.stash[_CHECKOUT])
    session.config.stash[_WRITTEN] = written
    if written and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_START_UP] = prewarmed.read_at_start(cli_env())  # before the test's fixtures
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A test leaves the variables read at start-up as it found them (after its fixtures are undone): one left
    behind in this worker's environment would start every later command of the worker fresh (tests/prewarmed.py).
    Lightning is imported before any test, as its import sets some (``PYTORCH_NVML_BASED_CUDA_CHECK``, and torch's
    inductor its cache folder) that no test should be blamed for."""
    result = yield
    before, after = item.stash.get(_START_UP, None), prewarmed.read_at_start(cli_env())
    if before is not None:
        changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
        assert not changed, f"the test left {changed} changed in the environment: set them with monkeypatch"
    return result


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def finished_run(main: Callable[[list[str]], None], prog: str, args: list[str], run_dir: Path) -> Path:
    """A finished two-step ``fit`` by ``main`` (checkpoints, logs and config), with ``sys.argv[0]`` the program its
    messages name."""
    sys_argv = sys.argv
    sys.argv = [prog]
    try:
        main(["fit", *args, f"--trainer.default_root_dir={run_dir}", "--trainer.max_steps=2"])
    except SystemExit as stop:
        assert stop.code in (0, None)
    finally:
        sys.argv = sys_argv
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    return run_dir


@contextlib.contextmanager
def unchanged(folder: Path) -> Iterator[Path]:
    """The folder; fails if any of its files changed meanwhile."""
    before = tree_digest(folder)
    yield folder
    assert tree_digest(folder) == before


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the tests' workload, which the tests that refuse bad input read and resume (``untouched``)."""
    from tests.cli import main

    return finished_run(main, CLI_MODULE, TINY_RUN, tmp_path_factory.mktemp("errors") / "run")


@pytest.fixture
def untouched(tiny_run: Path) -> Iterator[Path]:
    """The tiny run's directory; the test fails if any of its files changed."""
    with unchanged(tiny_run):
        yield tiny_run


_START_UP = pytest.StashKey[dict[str, str]]()
#: the checkout's changes when the run started, and those the tests added
_CHECKOUT = pytest.StashKey[set[str]]()
_WRITTEN = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process CLI calls pass ``args``; pytest's own argv must not look like CLI arguments."""
    monkeypatch.setattr(sys, "argv", [CLI_MODULE])


def cli_runner(module: str) -> Callable[..., subprocess.CompletedProcess]:
    """Run ``python -m MODULE ARGS`` in a subprocess (needed for ddp, which re-launches the script), forked from
    the prewarmed server (tests/prewarmed.py) unless ``fresh``."""

    def run(
        *args: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        timeout: int = 600,
        cwd: Path | None = None,
        fresh: bool = False,
    ):
        result = prewarmed.run(
            [sys.executable, "-m", module, *args],
            fresh=fresh,
            cwd=cwd or REPO,
            env=env or cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"CLI failed ({result.returncode}): {' '.join(args)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
            )
        return result

    return run


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess]:
    """``python -m tests.cli ARGS`` in a subprocess (``cli_runner``)."""
    return cli_runner(CLI_MODULE)


def read_metrics(run_dir: Path, version: int | None = None) -> list[dict[str, str]]:
    """Rows of ``metrics.csv`` of the latest (or given) logger version of a run directory."""
    versions = sorted((run_dir / "logs").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    folder = versions[-1] if version is None else run_dir / "logs" / f"version_{version}"
    with open(folder / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def last_value(rows: list[dict[str, str]], key: str) -> float:
    values = [float(row[key]) for row in rows if row.get(key) not in (None, "")]
    assert values, f"no {key} in metrics"
    return values[-1]


def load_state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.fixture
def project(tmp_path: Path, project_args: list[str]) -> Project:
    """The engine's ``project`` fixture (multigpu/testing.py) with this suite's environment, its commands forked
    from the prewarmed server (tests/prewarmed.py)."""
    return Project(REPO, tmp_path, project_args, cli=CLI_MODULE, env=cli_env(), runner=prewarmed.run)
