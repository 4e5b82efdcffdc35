"""The proofs a project's tests make for its own model and data, through its own command line (a pytest plugin).

pytest loads this module in every project that has the engine installed (the ``pytest11`` entry point of
``pyproject.toml``), so a project's test file reads::

    def test_it_trains(project):
        project.assert_trains()

    def test_ddp_trains_the_one_device_model(project):
        project.assert_same_model_under_ddp()

    def test_a_stopped_run_resumes_exactly(project):
        project.assert_exact_resume("--model.init_args.dropout=0.1")

    def test_a_bad_option_gets_one_paragraph(project):
        project.assert_refuses("--data.init_args.batch_size=0", option="--data.batch_size")

Each helper runs ``python -m src.cli fit ...`` in a subprocess from the project's root (pytest's ``rootdir``), as
its users run it, into fresh run directories under the test's ``tmp_path``, and fails with what differed. The
arguments every run gets come from the fixture ``project_args`` (a project's ``conftest.py`` overrides it: its
config file, smaller sizes). docs/engine.md ("Testing your project") says what each proof shows.

pytest imports this module at every start: it imports neither torch nor Lightning until a helper runs.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from multigpu.command import configured

#: the seed of every run (a project's ``seed_everything: true`` would draw a new one per run)
SEED = 42
#: optimizer steps of a helper's run: enough for a difference to show, few enough for seconds on 2 CPU cores
STEPS = 4
#: before ``project_args`` (which may change them): short, seeded runs, a training loss logged at every step
SMALL = (
    f"--seed_everything={SEED}",
    "--trainer.max_epochs=-1",  # max_steps ends every run, whatever the size of an epoch
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_model_summary=false",
)
#: after ``project_args`` (a helper's own arguments may change them): on the CPU, quiet, one CSV logger
FIXED = (
    "--trainer.accelerator=cpu",
    "--progress_bar=none",
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
    "--trainer.logger.init_args.name=logs",
)
FP64 = "--trainer.precision=64-true"
#: the exit status of a run that saved and stopped on SIGTERM (multigpu/callbacks/preemption.py)
SIGTERM_EXIT = 128 + signal.SIGTERM
#: variables that would make a run think it is one process of a cluster job, or change its config, if the tests
#: themselves run inside one (an ``srun`` step, a ``torchrun`` worker) or with a ``PL_FIT__...`` setting
JOB_VARIABLES = ("SLURM_", "PL_", "TORCHELASTIC_")
JOB_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Run:
    """One finished command: its exit status, its output and the run directory it wrote."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    def metrics(self) -> list[dict[str, str]]:
        """The rows of ``logs/version_*/metrics.csv``, every logger version in order (a resumed run adds one)."""
        files = (self.run_dir / "logs").glob("version_*/metrics.csv")
        rows: list[dict[str, str]] = []
        for path in sorted(files, key=lambda p: int(p.parent.name.split("_")[1])):
            with open(path, newline="") as handle:
                rows += csv.DictReader(handle)
        return rows

    def plan(self) -> dict[str, Any]:
        """The run plan of its first start (``logs/version_0/run_plan.json``); empty where none was written."""
        import json

        path = self.run_dir / "logs" / "version_0" / "run_plan.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def notes(self) -> list[str]:
        """The ``note:`` lines of its stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("note:")]

    def checkpoint(self, name: str = "last.ckpt") -> dict[str, Any]:
        """``checkpoints/<name>``, loaded with ``torch.load(..., weights_only=True)`` on the CPU."""
        import torch

        return torch.load(self.run_dir / "checkpoints" / name, map_location="cpu", weights_only=True)

    def describe(self) -> str:
        """The command and the end of its output, for a failure message."""
        return (
            f"command: {' '.join(self.command)}\nexit status {self.returncode}\n"
            f"stdout (end):\n{self.stdout[-1500:]}\nstderr (end):\n{self.stderr[-3000:]}"
        )


class Project:
    """A project's command line run as its users run it (python -m src.cli), in fresh run directories under tmp.

    Every run gets, in this order: the config files of ``args`` (``--config FILE``); ``SMALL`` and
    ``--trainer.max_steps`` (``STEPS`` unless a helper needs more); the rest of ``args`` (the project's own:
    ``project_args``); ``FIXED``; the arguments of the call; the helper's own settings;
    ``--trainer.default_root_dir`` (a fresh folder under ``tmp_path``). Later arguments win, so a project's
    flags may change the sizes, and a call may change anything.

    Args:
        root: The project's root folder (the command runs there, so ``src`` and relative config paths resolve).
        tmp_path: Where the run directories are made.
        args: Arguments of every run (a config file, smaller batches, ...): its config files before the helpers' sizes,
            its flags after them.
        cli: The module of the command line (``python -m <cli> fit ...``); default: the one the project's
            ``pyproject.toml`` names (``[tool.multigpu] cli``), else ``src.cli``.
        env: Variables to set for the runs, over this process's environment less the variables of a cluster job
            (``SLURM_*``, ``PL_*``, the rank variables) and with one compute thread per process
            (``OMP_NUM_THREADS=1`` unless set: the ranks of a ddp run share the cores).
        runner: Runs a command (``subprocess.run``'s signature and result); a project may start its commands
            some faster way.
    """

    def __init__(
        self,
        root: Path,
        tmp_path: Path,
        args: Sequence[str] = (),
        cli: str | None = None,
        env: Mapping[str, str] | None = None,
        runner: Callable[..., subprocess.CompletedProcess] | None = None,
    ) -> None:
        self.root = Path(root)
        self.tmp_path = Path(tmp_path)
        self.args = list(args)
        self.cli = cli or configured(root)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(JOB_VARIABLES) and k not in JOB_NAMES}
        self.env.setdefault("OMP_NUM_THREADS", "1")
        self.env.update(env or {})
        self.runner = runner or subprocess.run

    def run_dir(self, name: str) -> Path:
        """A run directory under ``tmp_path`` that no run has used (``name``, ``name-2``, ...)."""
        path, number = self.tmp_path / name, 1
        while path.exists():
            number += 1
            path = self.tmp_path / f"{name}-{number}"
        return path

    def fit(
        self,
        *args: str,
        run_dir: Path | None = None,
        check: bool = True,
        timeout: float = 600,
        max_steps: int = STEPS,
    ) -> Run:
        """``python -m <cli> fit`` with this project's arguments and ``args`` into ``run_dir`` (default: a fresh
        one); with ``check``, a non-zero exit status fails the test with the command and its output."""
        run_dir = Path(run_dir) if run_dir is not None else self.run_dir("run")
        configs, flags = split_configs(self.args)
        command = [
            sys.executable, "-m", self.cli, "fit", *configs, *SMALL, f"--trainer.max_steps={max_steps}", *flags,
            *FIXED, *args, f"--trainer.default_root_dir={run_dir}",
        ]  # fmt: skip
        done = self.runner(command, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        run = Run(command, done.returncode, done.stdout, done.stderr, run_dir)
        if check and run.returncode != 0:
            raise AssertionError(f"the run failed\n{run.describe()}")
        return run

    def assert_trains(self, *args: str) -> Run:
        """One run of ``STEPS`` steps exits 0, logs a finite training loss (every logged column whose name holds
        ``train`` and ``loss``: ``train/loss`` for the engine's models) and writes ``checkpoints/last.ckpt``."""
        run = self.fit(*args, run_dir=self.run_dir("trains"))
        rows = run.metrics()
        columns = sorted({key for row in rows for key in row if "train" in key and "loss" in key})
        assert columns, (
            f"no training loss was logged (columns: {sorted({k for r in rows for k in r})})\n{run.describe()}"
        )
        values = [(key, row["step"], row[key]) for row in rows for key in columns if row.get(key) not in (None, "")]
        bad = [f"{key}={value} at step {step}" for key, step, value in values if not math.isfinite(float(value))]
        assert values and not bad, f"the training loss is not finite: {bad or 'no values'}\n{run.describe()}"
        assert (run.run_dir / "checkpoints" / "last.ckpt").is_file(), f"no last.ckpt\n{run.describe()}"
        return run

    def assert_same_model_under_ddp(self, *args: str, devices: int = 2, tolerance: float = 1e-10) -> None:
        """``ddp`` on ``devices`` CPU processes trains the model one process trains: two runs in fp64
        (``--trainer.precision=64-true``, so that only the order of additions differs), one with
        ``--trainer.strategy=auto --trainer.devices=1``, one with ``--trainer.strategy=ddp``, whose ``last.ckpt``
        hold the same step and weights (every floating-point tensor of the state dict) to ``tolerance``, relative.

        A model that draws random numbers while training (dropout) draws other ones on each process: give it
        none here (e.g. ``--model.init_args.dropout=0``); ``assert_exact_resume`` is the proof with dropout on.
        """
        one = self.fit(*args, FP64, "--trainer.strategy=auto", "--trainer.devices=1", "--trainer.num_nodes=1",
                       run_dir=self.run_dir("one-device"))  # fmt: skip
        cause = order_cause(one.plan(), devices)  # said before a ddp run that could only show it as a difference
        assert cause is None, f"{cause} (one device: {one.run_dir})"
        many = self.fit(*args, FP64, "--trainer.strategy=ddp", f"--trainer.devices={devices}",
                        "--trainer.num_nodes=1", run_dir=self.run_dir("ddp"))  # fmt: skip
        where = f"one device: {one.run_dir}, ddp: {many.run_dir}"
        cause = order_cause(many.plan(), devices)  # a stream that shards itself by rank shows it under ddp only
        assert cause is None, f"{cause} ({where})"
        expected, got = one.checkpoint(), many.checkpoint()
        assert got["global_step"] == expected["global_step"], (
            f"ddp on {devices} processes ended at step {got['global_step']}, one device at"
            f" {expected['global_step']} ({where})"
        )
        difference = relative_difference(expected["state_dict"], got["state_dict"])
        if not difference < tolerance:
            worst = sorted(key_differences(expected["state_dict"], got["state_dict"]).items(), key=lambda kv: -kv[1])
            largest = "; ".join(f"{key}: {value:.3g}" for key, value in worst[:3])
            raise AssertionError(
                f"ddp on {devices} processes trained another model than one device: the weights after step"
                f" {got['global_step']} differ by {difference:.3g} relative (tolerance {tolerance:g}); the largest"
                f" relative differences: {largest} ({where}). A layer that computes over the batch (BatchNorm),"
                " random draws in training (dropout), or a data module whose batches or shards depend on the"
                " process count make this differ."
            )

    def assert_exact_resume(self, *args: str, stop_at_step: int = 2, tolerance: float = 0.0) -> None:
        """A run stopped by SIGTERM after step ``stop_at_step`` and resumed with ``--ckpt_path=last`` ends as the
        uninterrupted run does: the same step, weights, optimizer and LR-scheduler states in ``last.ckpt``, bit
        for bit (or to ``tolerance``, relative). Both train ``max(STEPS, stop_at_step + 2)`` steps; the signal
        comes from ``multigpu.testing.SignalAtStep``, added with ``--trainer.callbacks+=``, and the stopped run
        must exit with 143 (saved and stopped, ``multigpu/callbacks/preemption.py``).

        Turn the model's dropout on in ``args`` (e.g. ``--model.init_args.dropout=0.1``): the proof then also
        shows that every random generator the training draws from is saved and restored.
        """
        steps = max(STEPS, stop_at_step + 2)
        straight = self.fit(*args, run_dir=self.run_dir("uninterrupted"), max_steps=steps)
        signal_args = (
            "--trainer.callbacks+=multigpu.testing.SignalAtStep",
            f"--trainer.callbacks.step={stop_at_step}",
            "--trainer.callbacks.signal_name=SIGTERM",
        )
        stopped = self.fit(*args, *signal_args, run_dir=self.run_dir("stopped"), check=False, max_steps=steps)
        assert stopped.returncode == SIGTERM_EXIT, (
            f"the run sent SIGTERM after step {stop_at_step} (of {steps}) exited {stopped.returncode}, not"
            f" {SIGTERM_EXIT} (saved and stopped)\n{stopped.describe()}"
        )
        saved = stopped.checkpoint()["global_step"]
        assert saved == stop_at_step, f"the stopped run saved step {saved}, not {stop_at_step}\n{stopped.describe()}"
        resumed = self.fit(*args, "--ckpt_path=last", run_dir=stopped.run_dir, max_steps=steps)
        expected, got = straight.checkpoint(), resumed.checkpoint()
        found = differences(
            {key: expected[key] for key in ("global_step", "state_dict", "optimizer_states", "lr_schedulers")},
            {key: got.get(key) for key in ("global_step", "state_dict", "optimizer_states", "lr_schedulers")},
            tolerance,
        )
        if found:
            listed = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
            raise AssertionError(
                f"a run stopped after step {stop_at_step} and resumed ended with another state than the"
                f" uninterrupted one ({len(found)} difference(s), largest first): {listed} (uninterrupted:"
                f" {straight.run_dir}, resumed: {resumed.run_dir}). {resume_cause(resumed)}"
            )

    def assert_refuses(self, *args: str, option: str) -> str:
        """A run with the bad ``args`` exits with status 2 before training, with one paragraph on stderr (from
        its ``error:`` line to the end, no blank line, no traceback) that names ``option``, and writes no file
        into its run directory (empty folders a logger made are allowed). Returns the paragraph."""
        run = self.fit(*args, run_dir=self.run_dir("refused"), check=False)
        assert run.returncode == 2, f"expected exit status 2 (a refused option)\n{run.describe()}"
        assert "Traceback" not in run.stderr, f"the refusal printed a traceback\n{run.describe()}"
        lines = run.stderr.rstrip().splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
        assert starts, f"no line of stderr starts with 'error:'\n{run.describe()}"
        paragraph = "\n".join(lines[starts[0] :])
        assert "\n\n" not in paragraph, f"the refusal is more than one paragraph:\n{paragraph}"
        assert option in paragraph, f"the refusal does not name {option}:\n{paragraph}"
        written = sorted(str(p.relative_to(run.run_dir)) for p in run.run_dir.rglob("*") if not p.is_dir())
        assert not written, f"the refused run wrote {written} into {run.run_dir}"
        return paragraph


def order_cause(plan: Mapping[str, Any], devices: int) -> str | None:
    """Why ddp on ``devices`` processes cannot train the one-device model, in one sentence, from a run plan: a
    training loader whose order depends on the number of processes, or whose batch is per process (None: none)."""
    from multigpu.callbacks.run_plan import ORDER_DEPENDS

    source = plan.get("data") or plan.get("model")
    orders, meanings = _per_loader(plan.get("data_order")), _per_loader(plan.get("batch_size_means"))
    for (name, order), (_, meaning) in zip(orders, meanings, strict=False):
        if order.startswith(ORDER_DEPENDS):
            why = f"has an order that {order}"
        elif meaning.startswith("per process"):
            why = f"has a batch_size {meaning}, so a step on {devices} processes trains on {devices} times the samples"
        else:
            continue
        return f"ddp on {devices} processes cannot train the one-device model: the training {name} of {source} {why}."
    return None


def _per_loader(fact: str | list[str] | None) -> list[tuple[str, str]]:
    """A plan's fact of the training loader, or of each of several (``loader i: ...``), as (loader, fact) pairs."""
    if isinstance(fact, str):
        return [("loader", fact)]
    return [tuple(line.split(": ", 1)) for line in fact or []]  # type: ignore[misc]


def resume_cause(resumed: Run) -> str:
    """Why a resumed run may have ended elsewhere: a loader that said it restarts its epoch first."""
    restarts = ("cannot resume in the middle of its epoch", "restarts that epoch's data")
    restarted = [note for note in resumed.notes() if any(text in note for text in restarts)]
    if restarted:
        return f"The resumed run said: {' '.join(restarted)}"
    return (
        "A random generator of the model's or data's own that the checkpoint does not hold, state kept outside the"
        " model's state dict, or a training loader whose position the checkpoint does not hold (a sampler or"
        " stream the engine does not sample) makes this differ."
    )


def split_configs(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """``args`` split into its config files (``--config FILE``, ``--config=FILE``, ``-c FILE``) and the rest, each
    in order: a project's preset sets ``max_steps`` and the like, which the helpers' sizes must override."""
    configs: list[str] = []
    flags: list[str] = []
    words = iter(args)
    for word in words:
        if word in ("--config", "-c"):
            configs += [word, next(words, "")]
        elif word.startswith("--config="):
            configs.append(word)
        else:
            flags.append(word)
    return configs, flags


# -- comparing states --------------------------------------------------------------------------------------------


def _squares(a: Any, b: Any) -> tuple[float, float]:
    """(sum of squared differences, sum of squares of ``a``) over the entries finite in both tensors; infinite
    where a non-finite entry differs (a metric's ``-inf`` before its first value is equal to itself)."""
    x, y = a.detach().double().cpu(), b.detach().double().cpu()
    if x.shape != y.shape:
        return math.inf, float((x[x.isfinite()] ** 2).sum())
    finite = x.isfinite() & y.isfinite()
    same = (x == y) | (x.isnan() & y.isnan())
    if not bool(same[~finite].all()):
        return math.inf, float((x[finite] ** 2).sum())
    return float(((x - y)[finite] ** 2).sum()), float((x[finite] ** 2).sum())


def _floating(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    assert a.keys() == b.keys(), f"the state dicts hold other keys: only in one, {sorted(set(a) ^ set(b))}"
    return [key for key in a if getattr(a[key], "is_floating_point", lambda: False)()]


def relative_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """||a - b|| / ||a|| over all floating-point tensors of two state dicts (the same keys required); a
    non-finite entry counts only where the two differ (then the result is ``inf``)."""
    sums = [_squares(a[key], b[key]) for key in _floating(a, b)]
    difference, norm = sum(s[0] for s in sums), sum(s[1] for s in sums)
    return math.sqrt(difference / norm) if norm else (0.0 if difference == 0 else math.inf)


def key_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float]:
    """Each floating-point tensor's own relative difference (absolute where ``a``'s is zero)."""
    result = {}
    for key in _floating(a, b):
        difference, norm = _squares(a[key], b[key])
        result[key] = math.sqrt(difference / norm) if norm else math.sqrt(difference)
    return result


def differences(a: Any, b: Any, tolerance: float = 0.0, where: str = "") -> list[str]:
    """Where two nested states (dicts, lists, tensors, numbers) differ, largest tensor difference first: tensors
    must be equal, or within ``tolerance`` relative; NaN equals NaN."""
    import torch

    found: list[tuple[float, str]] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                found.append((math.inf, f"{path}: {x.dtype} {tuple(x.shape)} against {y.dtype} {tuple(y.shape)}"))
            elif x.is_floating_point():
                if not torch.allclose(x, y, rtol=tolerance, atol=0.0, equal_nan=True):
                    same = (x == y) | (x.isnan() & y.isnan())  # -inf against -inf too
                    apart = (x.double() - y.double()).abs().nan_to_num(math.inf)
                    largest = float(apart.masked_fill(same, 0).max())
                    found.append((largest, f"{path}: largest difference {largest:.3g}"))
            elif not torch.equal(x, y):
                found.append((math.inf, f"{path}: differs"))
        elif isinstance(x, Mapping) and isinstance(y, Mapping):
            if x.keys() != y.keys():
                found.append((math.inf, f"{path}: keys in only one: {sorted(map(str, set(x) ^ set(y)))}"))
            for key in [key for key in x if key in y]:
                walk(x[key], y[key], f"{path}[{key!r}]")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for index, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{path}[{index}]")
        elif x != y:
            found.append((math.inf, f"{path}: {x!r} against {y!r}"))

    walk(a, b, where)
    return [text for _, text in sorted(found, key=lambda item: -item[0])]


# -- the callback that stops a run -------------------------------------------------------------------------------


def _signal_at_step() -> type:
    from lightning.pytorch.callbacks import Callback

    class SignalAtStep(Callback):
        """Sends ``signal_name`` to its own process (on rank ``rank`` only) after optimizer step ``step``: a stop
        at a known step, as a scheduler's ``SIGTERM`` or SLURM's ``SIGUSR1`` warning brings one at any step.

        Add it to a run with ``--trainer.callbacks+=multigpu.testing.SignalAtStep --trainer.callbacks.step=2``.
        """

        def __init__(self, step: int, signal_name: str = "SIGUSR1", rank: int = 0) -> None:
            self.step = step
            self.signal_number = signal.Signals[signal_name]
            self.rank = rank
            self.sent = False

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if not self.sent and trainer.global_step == self.step and trainer.global_rank == self.rank:
                self.sent = True
                os.kill(os.getpid(), self.signal_number)

    SignalAtStep.__module__ = __name__
    SignalAtStep.__qualname__ = "SignalAtStep"
    return SignalAtStep


def __getattr__(name: str) -> Any:
    # SignalAtStep subclasses Lightning's Callback: built when first named (a run's --trainer.callbacks+=, an
    # import), so that pytest's start, which imports this module, does not import Lightning
    if name == "SignalAtStep":
        globals()[name] = value = _signal_at_step()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def project_args() -> list[str]:
    """The arguments every run of ``project`` gets: none here; a project's ``conftest.py`` overrides this fixture,
    e.g. to return ``["--trainer.max_steps=4", "--data.init_args.batch_size=8"]``."""
    return []


@pytest.fixture
def project(request: pytest.FixtureRequest, tmp_path: Path, project_args: list[str]) -> Project:
    """This project's command line (``python -m src.cli``, or the module its ``pyproject.toml`` names), run from
    pytest's rootdir, with ``project_args``."""
    return Project(request.config.rootpath, tmp_path, project_args)
