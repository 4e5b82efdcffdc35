"""The proofs a project's tests make for its own model through its own command line, as a pytest plugin that
imports neither torch nor Lightning until a helper runs (docs/engine.md, "Testing your project")."""

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

SEED = 42  # a project's seed_everything: true would draw a new one per run
STEPS = 4  # enough for a difference to show, few enough for seconds on 2 CPU cores
SMALL = (
    f"--seed_everything={SEED}",
    "--trainer.max_epochs=-1",  # max_steps ends every run, whatever the size of an epoch
    "--trainer.limit_val_batches=2",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_model_summary=false",
)
FIXED = (
    "--trainer.accelerator=cpu",
    "--progress_bar=none",
    "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
    "--trainer.logger.init_args.name=logs",
)
FP64 = "--trainer.precision=64-true"
SIGTERM_EXIT = 128 + signal.SIGTERM
# a run inside a cluster job's step (srun, torchrun) or with PL_FIT__... would take them as its own
JOB_VARIABLES = ("SLURM_", "PL_", "TORCHELASTIC_")
JOB_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Run:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    def metrics(self) -> list[dict[str, str]]:
        """The rows of every ``logs/version_*/metrics.csv``, in order (a resumed run adds a version)."""
        files = (self.run_dir / "logs").glob("version_*/metrics.csv")
        rows: list[dict[str, str]] = []
        for path in sorted(files, key=lambda p: int(p.parent.name.split("_")[1])):
            with open(path, newline="") as handle:
                rows += csv.DictReader(handle)
        return rows

    def plan(self) -> dict[str, Any]:
        """The run plan of its first start; empty where none was written."""
        import json

        path = self.run_dir / "logs" / "version_0" / "run_plan.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def notes(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("note:")]

    def checkpoint(self, name: str = "last.ckpt") -> dict[str, Any]:
        """``checkpoints/<name>``, loaded with ``weights_only=True`` on the CPU."""
        import torch

        return torch.load(self.run_dir / "checkpoints" / name, map_location="cpu", weights_only=True)

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.command)}\nexit status {self.returncode}\n"
            f"stdout (end):\n{self.stdout[-1500:]}\nstderr (end):\n{self.stderr[-3000:]}"
        )


class Project:
    """A project's command line run from ``root`` as its users run it, in fresh run directories under ``tmp_path``;
    ``cli`` defaults to the project's ``[tool.multigpu] cli``, ``runner`` (``subprocess.run``'s signature) runs it."""

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
        self.env.setdefault("OMP_NUM_THREADS", "1")  # the ranks of a ddp run share the cores
        self.env.update(env or {})
        self.runner = runner or subprocess.run

    def run_dir(self, name: str) -> Path:
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
        """``python -m <cli> fit`` with this project's arguments and ``args``; with ``check``, an exit status not 0
        fails the test. Later arguments win: a project's flags may change the sizes, a call anything."""
        run_dir = Path(run_dir) if run_dir is not None else self.run_dir("run")
        configs, flags = split_configs(self.args)
        command = [sys.executable, "-m", self.cli, "fit", *configs, *SMALL, f"--trainer.max_steps={max_steps}"]
        command += [*flags, *FIXED, *args, f"--trainer.default_root_dir={run_dir}"]
        done = self.runner(command, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        run = Run(command, done.returncode, done.stdout, done.stderr, run_dir)
        if check and run.returncode != 0:
            raise AssertionError(f"the run failed\n{run.describe()}")
        return run

    def assert_trains(self, *args: str) -> Run:
        """One run exits 0, logs a finite training loss and writes ``checkpoints/last.ckpt``."""
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
        """``ddp`` on ``devices`` CPU processes trains the model one process trains, in fp64, to ``tolerance``."""
        one_device = (FP64, "--trainer.strategy=auto", "--trainer.devices=1", "--trainer.num_nodes=1")
        one = self.fit(*args, *one_device, run_dir=self.run_dir("one-device"))
        cause = order_cause(one.plan(), devices)
        assert cause is None, f"{cause} (one device: {one.run_dir})"
        ddp = (FP64, "--trainer.strategy=ddp", f"--trainer.devices={devices}", "--trainer.num_nodes=1")
        many = self.fit(*args, *ddp, run_dir=self.run_dir("ddp"))
        where = f"one device: {one.run_dir}, ddp: {many.run_dir}"
        cause = order_cause(many.plan(), devices)
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
        """A run stopped by SIGTERM after ``stop_at_step`` and resumed ends as the uninterrupted run, bit for bit."""
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
        """A run with the bad ``args`` exits 2 with one paragraph naming ``option`` and writes no file; returns it."""
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
    """Why ddp on ``devices`` processes cannot train the one-device model, from a run plan, or None."""
    from multigpu.observe.run_plan import ORDER_DEPENDS

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
    if isinstance(fact, str):
        return [("loader", fact)]
    return [tuple(line.split(": ", 1)) for line in fact or []]  # type: ignore[misc]


def resume_cause(resumed: Run) -> str:
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
    """``args`` split into its config files and the rest: the helpers' sizes must override a preset's."""
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


def _squares(a: Any, b: Any) -> tuple[float, float]:
    # over the entries finite in both; a metric's -inf before its first value is equal to itself
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
    """||a - b|| / ||a|| over all floating-point tensors of two state dicts with the same keys."""
    sums = [_squares(a[key], b[key]) for key in _floating(a, b)]
    difference, norm = sum(s[0] for s in sums), sum(s[1] for s in sums)
    return math.sqrt(difference / norm) if norm else (0.0 if difference == 0 else math.inf)


def key_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float]:
    """Each floating-point tensor's relative difference (absolute where ``a``'s is zero)."""
    result = {}
    for key in _floating(a, b):
        difference, norm = _squares(a[key], b[key])
        result[key] = math.sqrt(difference / norm) if norm else math.sqrt(difference)
    return result


def differences(a: Any, b: Any, tolerance: float = 0.0, where: str = "") -> list[str]:
    """Where two nested states differ, largest first: tensors equal or within ``tolerance`` relative, NaN equal NaN."""
    import torch

    found: list[tuple[float, str]] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                found.append((math.inf, f"{path}: {x.dtype} {tuple(x.shape)} against {y.dtype} {tuple(y.shape)}"))
            elif x.is_floating_point():
                if not torch.allclose(x, y, rtol=tolerance, atol=0.0, equal_nan=True):
                    same = (x == y) | (x.isnan() & y.isnan())
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


def _signal_at_step() -> type:
    from lightning.pytorch.callbacks import Callback

    class SignalAtStep(Callback):
        """Sends ``signal_name`` to its own process on rank ``rank`` after optimizer step ``step``."""

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
    # built when first named: pytest imports this module at every start, which must not import Lightning
    if name == "SignalAtStep":
        globals()[name] = value = _signal_at_step()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@pytest.fixture
def project_args() -> list[str]:
    """The arguments every run of ``project`` gets; a project's ``conftest.py`` overrides this fixture."""
    return []


@pytest.fixture
def project(request: pytest.FixtureRequest, tmp_path: Path, project_args: list[str]) -> Project:
    """This project's command line, run from pytest's rootdir with ``project_args``."""
    return Project(request.config.rootpath, tmp_path, project_args)
