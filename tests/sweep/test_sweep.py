"""Sweeps (src/sweep/): the sweep file's checks, trials shared through one journal, the report, the pruning
callback; and, slow, whole sweeps of the tests' workload: a worker stopped by a signal and run again, a failed
trial, and ddp trials with pruning on 2 CPU processes."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from src.cli import main as cli_main
from src.sweep import spec as sweep_spec
from src.sweep.__main__ import main as sweep_main
from src.sweep.pruning import SweepPruning
from src.sweep.report import report
from src.sweep.runner import check_devices, with_trials
from src.sweep.study import ERROR_ATTR, LOCKS, PRUNED_ATTR, STEPS_ATTR, Sweep, bind, claim, run_dir
from src.sweep.worker import logger_flags
from tests.conftest import REPO, TINY, TINY_CONFIG, cli_env, read_metrics

LR = "model.init_args.optimizer.init_args.lr"
BATCH = "data.init_args.batch_size"
MAX_STEPS = 8  # 16 steps per epoch: validations at steps 4 and 8 (val_check_interval=4)
FIT = [
    "--config",
    str(TINY_CONFIG),
    f"--trainer.max_steps={MAX_STEPS}",
    "--trainer.val_check_interval=4",
    "--trainer.log_every_n_steps=1",
    "--progress_bar=none",
]


def write_sweep(folder: Path, **overrides: Any) -> Path:
    """A sweep file of the tests' workload; keyword arguments replace its top-level keys (None removes one)."""
    content: dict[str, Any] = {
        "fit": FIT,
        "objective": {"metric": "val/loss", "mode": "min"},
        "trials": 2,
        "sampler": {"name": "random", "seed": 0},
        "space": {LR: {"low": 1.0e-3, "high": 1.0e-1, "log": True}, BATCH: {"choices": [16, 32]}},
    }
    content.update(overrides)
    content = {k: v for k, v in content.items() if v is not None}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def sweep_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "src.sweep", *args],
        cwd=REPO,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result


# -- the sweep file ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"sampler": {"name": "tpx"}}, "sampler: unknown name 'tpx' (did you mean 'tpe'?). Fix: use one of tpe,"),
        ({"samplr": {"name": "tpe"}}, "unknown key 'samplr' (did you mean 'sampler'?). Fix: use only fit,"),
        ({"pruner": {"name": "medain"}}, "pruner: unknown name 'medain' (did you mean 'median'?)"),
        ({"space": {LR: {"low": 0.1, "high": 0.01}}}, f"space: {LR}: low (0.1) must be below high (0.01)"),
        ({"space": {LR: {"low": 0.1, "hgih": 1.0}}}, f"space: {LR}: unknown key 'hgih'. Fix: a range takes low,"),
        ({"space": {LR: {"low": 0.0, "high": 1.0, "log": True}}}, "a log range needs low > 0 (got 0.0)"),
        ({"space": {LR: [0.1, 0.01]}}, f"space: {LR} is [0.1, 0.01]. Fix: a range {{low:"),
        ({"space": {BATCH: {"choices": []}}}, f"space: {BATCH}: choices must be a non-empty list"),
        ({"objective": {"metric": "val/loss", "mode": "lowest"}}, "objective: mode: 'lowest' is neither min nor max"),
        ({"trials": 0}, "trials: 0 is not a positive whole number"),
        ({"fit": None}, "`fit` is missing. Fix: add it"),
        ({"sampler": {"name": "grid"}}, f"space: {LR} is a continuous range, which a grid cannot walk. Fix:"),
        ({"sampler": {"name": "tpe", "n_startup": 3}}, "sampler: TPESampler does not accept {'n_startup': 3}"),
    ],
)
def test_bad_sweep_file_is_one_paragraph_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, overrides: dict[str, Any], expected: str
) -> None:
    path = write_sweep(tmp_path, **overrides)
    sweep_dir = tmp_path / "sweep"
    assert sweep_main(["run", str(path), "--dir", str(sweep_dir)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and expected in error, error
    assert "Fix" in error and error.count("\n") == 1  # one paragraph
    assert not sweep_dir.exists()  # nothing written


def test_misspelt_searched_option_is_refused_by_the_cli_before_anything_starts(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, space={"model.init_args.optimizer.init_args.lrr": {"low": 0.001, "high": 0.1}})
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert result.returncode == 2
    assert "Option 'lrr' is not accepted" in result.stderr  # the CLI's own message, with its fix
    assert "error: the sweep's fit arguments do not parse (the error above" in result.stderr
    assert "Fix: correct `fit` or `space` in the sweep file" in result.stderr
    assert not sweep_dir.exists()  # nothing written: the corrected file starts afresh in the same --dir


def test_sweep_file_values_become_fit_flags(tmp_path: Path) -> None:
    spec = sweep_spec.load(write_sweep(tmp_path, space={BATCH: {"low": 16, "high": 64, "step": 16}}))
    assert spec.space[0].grid() == [16, 32, 48, 64] and spec.space[0].is_int
    assert not sweep_spec.Param("model.init_args.dropout", low=0, high=1).is_int  # no step: a float range
    logs = sweep_spec.load(
        write_sweep(tmp_path, space={"model.init_args.hidden": {"low": 8, "high": 64, "step": 1, "log": True}})
    )
    assert logs.space[0].is_int and logs.space[0].log
    assert sweep_spec.flag(LR, 0.003) == f"--{LR}=0.003"
    assert sweep_spec.flag("trainer.gradient_clip_val", None) == "--trainer.gradient_clip_val=null"
    assert sweep_spec.flag("model.init_args.compile", True) == "--model.init_args.compile=true"
    grid = sweep_spec.load(
        write_sweep(tmp_path, sampler={"name": "grid"}, trials=50, space={BATCH: {"choices": [8, 16]}})
    )
    assert grid.grid_size() == 2


def test_a_directory_keeps_its_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep_dir = tmp_path / "sweep"
    bind(sweep_spec.load(write_sweep(tmp_path)), sweep_dir)
    bind(sweep_spec.load(write_sweep(tmp_path, trials=5)), sweep_dir)  # more trials: the same sweep, extended
    assert yaml.safe_load((sweep_dir / "sweep.yaml").read_text())["trials"] == 5
    other = write_sweep(tmp_path, objective={"metric": "val/acc", "mode": "max"})
    assert sweep_main(["run", str(other), "--dir", str(sweep_dir)]) == 2
    error = capsys.readouterr().err
    assert (
        f"{sweep_dir} holds a sweep of another sweep file (objective differ" in error
        and "Fix: start it in a new" in error
    )


def test_more_workers_than_devices_is_refused() -> None:
    cpus = os.cpu_count() or 1
    assert check_devices({"accelerator": "cpu", "devices": 1}, workers=cpus) == ("cpu", 1)
    with pytest.raises(sweep_spec.SweepError) as refused:
        check_devices({"accelerator": "cpu", "devices": 2}, workers=cpus)
    message = str(refused.value)
    assert f"--workers {cpus} x 2 cpu device(s) per trial (--trainer.devices=2) needs {2 * cpus} devices" in message
    assert f"Fix: --workers {max(cpus // 2, 1)}, or fewer devices per trial" in message


# -- one journal, many workers ----------------------------------------------------------------------------------


def _claim_all(path: str, sweep_dir: str, out: str) -> None:
    """A worker without fit runs: claim trials until none is left, complete each, write down their numbers."""
    sweep = Sweep(sweep_spec.load(path), Path(sweep_dir))
    numbers = []
    while (claimed := claim(sweep)) is not None:
        numbers.append(claimed.trial.number)
        time.sleep(0.01)  # a trial takes time: the others claim meanwhile
        sweep.study.tell(claimed.trial.number, claimed.trial.params[LR])
        claimed.release()
    Path(out).write_text(json.dumps(numbers))


def test_workers_share_one_journal_and_never_run_a_trial_twice(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=12)
    sweep_dir = tmp_path / "sweep"
    bind(sweep_spec.load(path), sweep_dir)
    context = multiprocessing.get_context("fork")  # separate processes, each with its own view of the journal
    outs = [tmp_path / f"worker{i}.json" for i in range(3)]
    workers = [context.Process(target=_claim_all, args=(str(path), str(sweep_dir), str(o))) for o in outs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    claimed = [n for o in outs for n in json.loads(o.read_text())]
    assert sorted(claimed) == list(range(12))  # every trial once, none twice
    study = Sweep(sweep_spec.load(path), sweep_dir).study
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 12
    assert len({t.params[LR] for t in trials}) == 12  # the workers drew different values, though seeded alike


def test_a_stopped_trial_is_resumed_and_a_held_one_is_not(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=3)
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    first, second = claim(sweep), claim(sweep)
    assert first and second and (first.trial.number, second.trial.number) == (0, 1)
    first.release()  # its worker stopped (a signal, a kill): trial 0 is running, and nobody holds it
    resumed = claim(sweep)
    assert resumed and resumed.resumed and resumed.trial.number == 0
    assert resumed.trial.params == first.trial.params  # the same values, not a new draw
    third = claim(sweep)  # trial 1 is held by its live worker: not taken, a new trial instead
    assert third and not third.resumed and third.trial.number == 2
    assert claim(sweep) is None  # three trials exist and each is held


def test_more_trials_extend_a_finished_sweep(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=2)
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    for _ in range(2):
        claimed = claim(sweep)
        assert claimed is not None
        sweep.study.tell(claimed.trial.number, 0.5)
        claimed.release()
    assert claim(sweep) is None  # complete
    extended = with_trials(sweep_spec.load(path), 3)  # run --trials 3
    sweep = Sweep(bind(extended, sweep_dir), sweep_dir)
    claimed = claim(sweep)
    assert claimed is not None and claimed.trial.number == 2 and not claimed.resumed
    assert claim(sweep) is None
    assert sorted(p.name for p in (sweep_dir / LOCKS).iterdir()) == ["0.lock", "1.lock", "2.lock", "claim.lock"]


def test_a_grid_gives_each_trial_its_own_point_and_ends_with_the_grid(tmp_path: Path) -> None:
    path = write_sweep(
        tmp_path, trials=50, sampler={"name": "grid", "seed": 3}, space={BATCH: {"choices": [8, 16, 32]}}
    )
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(path), sweep_dir), sweep_dir)
    claims = [claim(sweep) for _ in range(3)]
    assert sorted(c.trial.params[BATCH] for c in claims if c) == [8, 16, 32]
    assert sweep.total() == 3 and claim(sweep) is None


# -- the report -------------------------------------------------------------------------------------------------


def test_report_ranks_trials_best_first_and_names_the_best_config(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep_dir = tmp_path / "sweep"
    sweep = Sweep(bind(sweep_spec.load(write_sweep(tmp_path, trials=5)), sweep_dir), sweep_dir)
    distributions = {LR: FloatDistribution(1e-3, 1e-1, log=True), BATCH: CategoricalDistribution([16, 32])}

    def add(state: TrialState, value: float | None, lr: float, **attrs: Any) -> None:
        steps = {4: value} if state != TrialState.COMPLETE and value is not None else {}
        trial = create_trial(
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            params={LR: lr, BATCH: 16},
            distributions=distributions,
            user_attrs={STEPS_ATTR: 8, "wall_s": 3.5, **attrs},
            intermediate_values=steps,
        )
        sweep.study.add_trial(trial)

    add(TrialState.COMPLETE, 0.9, 0.01)
    add(TrialState.FAIL, None, 0.02, **{ERROR_ATTR: "exit status 2: error: bad"})
    add(TrialState.COMPLETE, 0.5, 0.03)
    add(TrialState.PRUNED, 1.2, 0.04, **{PRUNED_ATTR: "the pruner stopped it"})
    add(TrialState.PRUNED, None, 0.05, **{PRUNED_ATTR: "the training loss became non-finite (NaN or inf)"})
    best = report(sweep_dir)
    with open(sweep_dir / "leaderboard.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["trial"], r["state"]) for r in rows] == [
        ("2", "complete"),
        ("0", "complete"),
        ("3", "pruned"),
        ("4", "pruned"),
        ("1", "fail"),
    ]
    assert list(rows[0]) == ["trial", "state", "val/loss", LR, BATCH, "steps", "wall_s", "run_dir", "note"]
    assert rows[0]["val/loss"] == "0.5" and rows[0][LR] == "0.03" and rows[0]["steps"] == "8"
    assert rows[0]["run_dir"] == str(run_dir(sweep_dir, 2)) and rows[4]["note"] == "exit status 2: error: bad"
    assert rows[2]["val/loss"] == "1.2" and rows[2]["note"] == "the pruner stopped it"
    assert rows[3]["val/loss"] == "" and rows[3]["note"].startswith("the training loss became non-finite")
    markdown = (sweep_dir / "leaderboard.md").read_text().splitlines()
    assert len(markdown) == 2 + 5 and markdown[2].startswith("| 2 | complete | 0.5 |")
    assert (sweep_dir / "leaderboard.png").stat().st_size > 10_000
    assert best == run_dir(sweep_dir, 2) / "config.yaml"
    assert capsys.readouterr().out.splitlines()[-1] == f"best trial 2 (val/loss=0.5): {best}"


# -- the pruning callback and the loggers -----------------------------------------------------------------------


def _trainer(metrics: dict[str, Any], step: int = 4) -> SimpleNamespace:
    return SimpleNamespace(
        sanity_checking=False,
        callback_metrics=metrics,
        is_global_zero=True,
        global_step=step,
        strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj),
        should_stop=False,
    )


def test_objective_not_logged_fails_naming_the_logged_metrics() -> None:
    from src.errors import ConfigurationError

    callback = SweepPruning(monitor="val/los")
    with pytest.raises(ConfigurationError) as error:
        callback.on_validation_end(_trainer({"val/loss": torch.tensor(0.5), "val/acc": torch.tensor(0.7)}), None)
    assert "objective val/los is not logged at validation (logged: val/acc, val/loss). Fix:" in str(error.value)


def test_non_finite_objective_prunes_without_reporting(capsys: pytest.CaptureFixture) -> None:
    class Trial:
        reported: list[tuple[float, int]] = []

        def report(self, value: float, step: int) -> None:
            self.reported.append((value, step))

        def should_prune(self) -> bool:
            return False

    callback = SweepPruning()
    callback.trial = Trial()
    finite = _trainer({"val/loss": torch.tensor(0.5)})
    callback.on_validation_end(finite, None)
    assert not finite.should_stop and callback.trial.reported == [(0.5, 4)]
    diverged = _trainer({"val/loss": torch.tensor(float("nan"))}, step=8)
    callback.on_validation_end(diverged, None)
    assert diverged.should_stop and callback.trial.reported == [(0.5, 4)]  # NaN never reaches the sampler
    assert "trial pruned: val/loss was nan at step 8" in capsys.readouterr().err


def test_wandb_logger_gets_the_sweep_group_and_trial_name(run_cli: Any, tmp_path: Path) -> None:
    logger = yaml.safe_load((REPO / "configs" / "logger" / "wandb.yaml").read_text())["trainer"]["logger"]
    flags = logger_flags(logger, "lr-sweep", "lr-sweep-trial-0003")
    assert logger_flags({"class_path": "lightning.pytorch.loggers.CSVLogger"}, "g", "n") == []
    trial_config = run_cli("fit", *TINY, "--config", "configs/logger/wandb.yaml", *flags, "--print_config")
    init_args = yaml.safe_load(trial_config.stdout)["trainer"]["logger"]["init_args"]
    assert (init_args["group"], init_args["name"]) == ("lr-sweep", "lr-sweep-trial-0003")
    assert init_args["project"] == "lightning-multigpu-template"  # the rest of the logger's config is kept


# -- whole sweeps (slow) ----------------------------------------------------------------------------------------


def final_step(folder: Path) -> int:
    return torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]


def trained_steps(folder: Path, version: int | None = None) -> list[int]:
    """The step of every train/loss row of one start (or of all starts) of a run (log_every_n_steps=1)."""
    count = len(list((folder / "logs").glob("version_*")))
    versions = range(count) if version is None else [version]
    return [int(row["step"]) for v in versions for row in read_metrics(folder, v) if row.get("train/loss")]


def assert_resumed_once(folder: Path, saved: int) -> None:
    """A run stopped once at step ``saved``: its second start trained exactly the steps after it, the first none
    after it (the first start may lack the row of the step it stopped at: the stop comes before that row)."""
    before, after = trained_steps(folder, 0), trained_steps(folder, 1)
    assert max(before) < saved and after == list(range(saved, MAX_STEPS)), (before, after)


@pytest.mark.slow
def test_stopped_worker_resumes_its_trial_and_the_sweep_completes_once(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, trials=2)
    sweep_dir, progress = tmp_path / "sweep", tmp_path / "progress"
    pace = ["--trainer.callbacks+=tests.helpers.Pace", "--trainer.callbacks.seconds=0.2"]
    first = subprocess.Popen(
        [sys.executable, "-m", "src.sweep", "run", str(path), "--dir", str(sweep_dir), "--", *pace,
         f"--trainer.callbacks.progress_file={progress}"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (progress.is_file() and len(progress.read_text().split()) >= 3):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0]
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)  # the worker passes it to its fit run, which saves and stops
    output = first.communicate(timeout=120)[0]
    assert first.returncode == 143, output
    assert "sweep: worker 0: trial 0 stopped by SIGTERM; the next `run` resumes it" in output
    stopped_at = final_step(run_dir(sweep_dir, 0))
    assert 3 <= stopped_at < MAX_STEPS

    again = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 0 resumed" in again.stdout and "trial 1" in again.stdout and "trial 2" not in again.stdout
    trial0 = run_dir(sweep_dir, 0)
    assert f"Restoring states from the checkpoint path at {trial0}/checkpoints/last.ckpt" in again.stdout
    study = Sweep(sweep_spec.load(path), sweep_dir).study
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for trial in trials:  # each trial trained its full steps exactly once
        folder = run_dir(sweep_dir, trial.number)
        assert final_step(folder) == MAX_STEPS and trial.user_attrs[STEPS_ATTR] == MAX_STEPS
        if trial.number != 0:
            assert trained_steps(folder) == list(range(MAX_STEPS)), trial.number
        assert sorted(trial.intermediate_values) == [4, 8] and trial.value == trial.intermediate_values[8]
    assert sorted(p.name for p in (trial0 / "logs").iterdir()) == ["version_0", "version_1"]
    assert_resumed_once(trial0, stopped_at)
    assert trials[0].user_attrs["starts"] == 2 and all(t.user_attrs["starts"] == 1 for t in trials[1:])

    # a trial's config.yaml is the whole run: fit --config trains the same model again, in another directory
    config_file = run_dir(sweep_dir, 1) / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == trials[1].params[LR]
    assert config["data"]["init_args"]["batch_size"] == trials[1].params[BATCH] and config["ckpt_path"] is None
    again_dir = tmp_path / "again"
    cli_main(["fit", "--config", str(config_file), f"--trainer.default_root_dir={again_dir}"])
    val_loss = [
        [r["val/loss"] for r in read_metrics(d) if r.get("val/loss")] for d in (run_dir(sweep_dir, 1), again_dir)
    ]
    assert len(val_loss[0]) == 2 and val_loss[0] == val_loss[1]
    assert not (run_dir(sweep_dir, 1) / "logs" / "version_1").exists()  # nothing written into the trial's directory

    done = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert done.returncode == 0 and f"{sweep_dir} is complete: 2 of 2 trials (2 complete); nothing to do" in done.stdout
    assert "Run plan" not in done.stdout  # nothing started, not even the dry run


@pytest.mark.slow
def test_failed_trials_are_recorded_with_their_message_and_not_retried(tmp_path: Path) -> None:
    """Two workers (processes) on the 2 CPUs, one trial each, both failing at their first validation."""
    path = write_sweep(tmp_path, trials=2, objective={"metric": "val/lost", "mode": "min"})
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir), "--workers", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 worker(s), 1 cpu device(s) per trial" in result.stdout
    assert "sweep: worker 0: trial" in result.stdout and "sweep: worker 1: trial" in result.stdout
    assert "[trial 0] Run plan" in result.stdout and "[trial 1] Run plan" in result.stdout  # whose line is whose
    trials = Sweep(sweep_spec.load(path), sweep_dir).study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 2
    for trial in trials:
        message = trial.user_attrs[ERROR_ATTR]
        assert message.startswith("exit status 2: error: the sweep's objective val/lost is not logged at validation")
        assert "(logged: train/loss, val/acc, val/acc_best, val/loss). Fix: set objective:" in message
        assert not list((run_dir(sweep_dir, trial.number) / "checkpoints").glob("best-*"))  # stopped at once
    again = sweep_cli("run", str(path), "--dir", str(sweep_dir))
    assert "is complete: 2 of 2 trials (2 failed); nothing to do" in again.stdout
    report_run = sweep_cli("report", str(sweep_dir), "--no-plot")
    assert report_run.returncode == 0 and "| 0 | fail |" in report_run.stdout and "| 1 | fail |" in report_run.stdout
    assert report_run.stdout.splitlines()[-1] == "sweep: no trial is complete yet"


@pytest.mark.slow
def test_ddp_trials_see_one_set_of_values_and_prune_together(tmp_path: Path) -> None:
    """Two ddp trials on 2 CPU processes: each rank trains with the values the worker asked for once; the trial
    with a tiny learning rate is pruned at its first validation, on both ranks at the same step."""
    path = write_sweep(
        tmp_path,
        fit=[
            *FIT,
            "--trainer.strategy=ddp",
            "--trainer.devices=2",
            "--trainer.callbacks+=tests.fixtures.sweep_probes.RankView",
        ],
        sampler={"name": "grid", "seed": 0},
        pruner={"name": "threshold", "upper": 1.2},
        space={LR: {"choices": [1.0e-5, 0.05]}, BATCH: {"choices": [32]}},
        trials=2,
    )
    sweep_dir = tmp_path / "sweep"
    result = sweep_cli("run", str(path), "--dir", str(sweep_dir), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    trials = {t.params[LR]: t for t in Sweep(sweep_spec.load(path), sweep_dir).study.get_trials()}
    assert set(trials) == {1.0e-5, 0.05}
    for lr, trial in trials.items():
        folder = run_dir(sweep_dir, trial.number)
        views = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        assert views[0]["world_size"] == 2
        assert views[0] == views[1]  # the same values and the same stopping step on both ranks
        assert (views[0]["lr"], views[0]["batch_size"]) == (lr, 32)
    slow, fast = trials[1.0e-5], trials[0.05]
    assert slow.state == TrialState.PRUNED and slow.intermediate_values[4] > 1.2
    assert json.loads((run_dir(sweep_dir, slow.number) / "rank1.json").read_text())["global_step"] == 4
    assert "the pruner stopped it" in slow.user_attrs[PRUNED_ATTR]
    assert fast.state == TrialState.COMPLETE and fast.value < 1.2
    assert json.loads((run_dir(sweep_dir, fast.number) / "rank1.json").read_text())["global_step"] == MAX_STEPS
