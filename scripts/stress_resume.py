"""Exact resume under SIGKILL, many times: uninterrupted runs, then trials that kill a run at random moments and
resume it with ``--ckpt_path=last`` until it finishes, each finished run compared bit for bit with the uninterrupted
one (weights, optimizer and LR-scheduler states, every validation loss).

    python scripts/stress_resume.py --trials 10                       # the GPT preset below, 1 kill per trial
    python scripts/stress_resume.py --trials 20 --kills 3 -- --trainer.max_steps=60
    python scripts/stress_resume.py --trials 10 --devices 2           # ddp on 2 CPU processes

The preset is the GPT example in fp64 with dropout 0.1, a checkpoint every 5 steps and one validation at step 200
of 240; arguments after ``--`` are added to every run. A kill (``tests.helpers.KillAt``) ends every process of the
run with SIGKILL at a random step, at one of: right after the step's update, inside the step (after backward,
before the optimizer), half-way through the background write of a checkpoint, right after a checkpoint is renamed
into place, or at a random time within the step. The first ``--references`` uninterrupted runs must equal each
other (the run is deterministic); every trial must equal the first. Folders of runs that differ are kept under
``--keep`` (with each run's log); the others are removed. Exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import csv
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRESET = [
    "--config=configs/experiment/gpt.yaml", "--seed_everything=7", "--trainer.precision=64-true",
    "--trainer.max_steps=240", "--trainer.val_check_interval=200", "--trainer.num_sanity_val_steps=0",
    "--model.init_args.dropout=0.1", "--data.init_args.corpus_chars=40000", "--checkpoint.every_n_train_steps=5",
]  # fmt: skip
MOMENTS = ("step", "optimizer", "write", "rename", "anywhere")
COMPARED = ("global_step", "state_dict", "optimizer_states", "lr_schedulers")


def option(args: list[str], name: str) -> str:
    """The value the last ``--name=value`` of ``args`` gives."""
    return [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")][-1]


def fit(args: list[str], run_dir: Path, log: Path, *extra: str) -> int:
    """One ``fit`` in a session of its own (a kill ends its process group: every rank); its exit status."""
    command = [sys.executable, "-m", "src.cli", "fit", *args, f"--trainer.default_root_dir={run_dir}", *extra]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        ).returncode


def saved_step(run_dir: Path) -> int:
    import torch

    last = run_dir / "checkpoints" / "last.ckpt"
    return torch.load(last, map_location="cpu", weights_only=False)["global_step"] if last.exists() else 0


def validation_losses(run_dir: Path) -> dict[str, str]:
    """Step -> ``val/loss`` as logged, across the run's resumes (a later log's row replaces an earlier one's)."""
    losses: dict[str, str] = {}
    for path in sorted((run_dir / "logs").glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        with path.open() as file:
            losses.update({row["step"]: row["val/loss"] for row in csv.DictReader(file) if row.get("val/loss")})
    return losses


def compare(expected: Path, got: Path) -> list[str]:
    import torch

    from multigpu.testing import differences

    a, b = (
        torch.load(d / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False) for d in (expected, got)
    )
    found = differences({k: a[k] for k in COMPARED}, {k: b.get(k) for k in COMPARED})
    losses_a, losses_b = validation_losses(expected), validation_losses(got)
    if losses_a != losses_b:
        found.append(f"validation losses {losses_b} against {losses_a}")
    return found


def trial(args: list[str], run_dir: Path, log: Path, kills: int, rng: random.Random) -> list[str]:
    """Kill the run ``kills`` times at random moments, resuming each time, then let it finish; what happened."""
    steps, every = int(option(args, "trainer.max_steps")), int(option(args, "checkpoint.every_n_train_steps"))
    events: list[str] = []
    for _ in range(kills):
        start = saved_step(run_dir)
        saving = [s for s in range(start + 1, steps) if s % every == 0]
        moment = rng.choice([m for m in MOMENTS if saving or m not in ("write", "rename")])
        choices = saving if moment in ("write", "rename") else list(range(start + 1, steps))  # a write needs a save
        if not choices:
            break
        step = rng.choice(choices)
        kill = ["--trainer.callbacks+=tests.helpers.KillAt", f"--trainer.callbacks.step={step}",
                f"--trainer.callbacks.moment={moment}"]  # fmt: skip
        resume = ["--ckpt_path=last"] if start else []
        status = fit(args, run_dir, log, *kill, *resume)
        if status != -9:
            raise SystemExit(f"a run to be killed at step {step} ({moment}) exited {status}: see {log}")
        events.append(f"killed at step {step} ({moment}), resumed from step {saved_step(run_dir)}")
    status = fit(args, run_dir, log, *(["--ckpt_path=last"] if saved_step(run_dir) else []))
    if status != 0:
        raise SystemExit(f"the resumed run exited {status}: see {log}")
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kills", type=int, default=1, help="kills per trial")
    parser.add_argument("--references", type=int, default=2, help="uninterrupted runs, compared with each other")
    parser.add_argument("--devices", type=int, default=1, help="more than 1: ddp on that many CPU processes")
    parser.add_argument("--seed", type=int, default=None, help="of the random kill moments (printed)")
    parser.add_argument("--keep", type=Path, default=REPO / "runs" / "stress_resume", help="where differing runs stay")
    parser.add_argument("extra", nargs="*", help="arguments added to every run (after --)")
    options = parser.parse_args(argv)
    seed = options.seed if options.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    args = [*PRESET, *options.extra]
    if options.devices > 1:
        args += ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", f"--trainer.devices={options.devices}"]
    work = Path(tempfile.mkdtemp(prefix="stress_resume."))
    print(f"seed {seed}; runs in {work}; differing runs kept in {options.keep}", flush=True)
    failures = 0  # runs that differ: uninterrupted ones from the first, or trials

    def keep(run_dir: Path, log: Path) -> None:
        options.keep.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), options.keep / run_dir.name)
        shutil.move(str(log), options.keep / log.name)

    reference = work / "reference-0"
    for index in range(options.references):
        run_dir, log = work / f"reference-{index}", work / f"reference-{index}.log"
        if fit(args, run_dir, log) != 0:
            raise SystemExit(f"an uninterrupted run failed: see {log}")
        found = compare(reference, run_dir) if index else []
        print(f"uninterrupted {index}: " + ("equal to uninterrupted 0" if index and not found else "done"
              if not index else f"DIFFERS from uninterrupted 0: {'; '.join(found[:3])}"), flush=True)  # fmt: skip
        if found:
            failures += 1
            keep(run_dir, log)
    exact = 0
    for index in range(options.trials):
        run_dir, log = work / f"trial-{index}", work / f"trial-{index}.log"
        events = trial(args, run_dir, log, options.kills, rng)
        found = compare(reference, run_dir)
        verdict = "bit-exact" if not found else f"DIFFERS ({len(found)}): {'; '.join(found[:3])}"
        print(f"trial {index}: {'; '.join(events)}: {verdict}", flush=True)
        exact += not found
        if found:
            failures += 1
            keep(run_dir, log)
    print(f"{exact} of {options.trials} trials bit-exact; {failures} run(s) differ", flush=True)
    if failures:
        keep(reference, work / "reference-0.log")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
