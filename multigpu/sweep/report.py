"""``python -m multigpu.sweep report DIR``: the leaderboard (``leaderboard.csv``, ``leaderboard.md``) and a plot."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from multigpu.sweep.study import (
    ERROR_ATTR,
    PRUNED_ATTR,
    STEPS_ATTR,
    STOPPED_ATTR,
    WALL_ATTR,
    Sweep,
    load_spec,
    run_dir,
)

STATE_ORDER = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2, TrialState.FAIL: 3}


def objective(trial: FrozenTrial) -> float | None:
    """The trial's value; for a pruned or unfinished trial, the last value it reported."""
    if trial.value is not None:
        return trial.value
    if trial.intermediate_values:
        return trial.intermediate_values[max(trial.intermediate_values)]
    return None


def ranked(trials: list[FrozenTrial], mode: str) -> list[FrozenTrial]:
    sign = 1 if mode == "min" else -1

    def key(trial: FrozenTrial) -> tuple[int, float, int]:
        value = objective(trial)
        finite = value is not None and math.isfinite(value)
        return STATE_ORDER.get(trial.state, 4), sign * value if finite else math.inf, trial.number

    return sorted(trials, key=key)


def rows(sweep: Sweep) -> list[dict[str, Any]]:
    """The leaderboard's rows, best first: complete, pruned (by their last value), then unfinished and failed."""
    spec = sweep.spec
    table = []
    for trial in ranked(sweep.study.get_trials(deepcopy=False), spec.mode):
        attrs = trial.user_attrs
        note = attrs.get(ERROR_ATTR) or attrs.get(PRUNED_ATTR) or ""
        if trial.state == TrialState.RUNNING:
            note = attrs.get(STOPPED_ATTR, "running")
        value = objective(trial)
        table.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                spec.metric: "" if value is None else f"{value:.6g}",
                **{p.key: trial.params.get(p.key, "") for p in spec.space},
                "steps": attrs.get(STEPS_ATTR, ""),
                "wall_s": attrs.get(WALL_ATTR, ""),
                "run_dir": str(run_dir(sweep.dir, trial.number)),
                "note": note,
            }
        )
    return table


def write_csv(table: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)


def write_markdown(table: list[dict[str, Any]], path: Path) -> None:
    header = list(table[0])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in table:
        cells = [str(row[k]).replace("|", "/") for k in header]
        lines.append("| " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def plot(sweep: Sweep, path: Path) -> None:
    """The objective over trials (best so far as a line) and against each searched value."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster node
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    spec = sweep.spec
    trials = [t for t in sweep.study.get_trials(deepcopy=False) if objective(t) is not None]
    trials = [t for t in trials if math.isfinite(objective(t))]  # type: ignore[arg-type]
    panels = 1 + len(spec.space)
    figure, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 3.6), squeeze=False)
    colours = {TrialState.COMPLETE: "tab:blue", TrialState.PRUNED: "tab:orange", TrialState.RUNNING: "tab:gray"}
    over = axes[0][0]
    for trial in trials:
        over.scatter(trial.number, objective(trial), color=colours.get(trial.state, "tab:red"), s=18)
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.number)
    best, line = None, []
    for trial in complete:
        value = objective(trial)
        better = min if spec.mode == "min" else max
        best = value if best is None else better(best, value)
        line.append((trial.number, best))
    if line:
        over.step(*zip(*line, strict=True), where="post", color="tab:blue", label="best so far")
        over.legend(loc="best", fontsize=8)
    over.xaxis.set_major_locator(MaxNLocator(integer=True))
    over.set_xlabel("trial")
    over.set_ylabel(spec.metric)
    over.set_title("objective over trials (orange: pruned)", fontsize=9)
    for axis, param in zip(axes[0][1:], spec.space, strict=True):
        points = [(t.params[param.key], objective(t), t.state) for t in trials if param.key in t.params]
        labels: list[Any] = []
        for value, result, state in points:
            x = value
            if param.choices is not None:  # categories: one column each, in the file's order
                labels = [str(c) for c in param.choices]
                x = labels.index(str(value))
            axis.scatter(x, result, color=colours.get(state, "tab:red"), s=18)
        if labels:
            axis.set_xticks(range(len(labels)), labels)
        elif param.log:
            axis.set_xscale("log")
        axis.set_xlabel(param.key.rsplit(".", 1)[-1])
        axis.set_title(param.key, fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(sweep_dir: Path, plot_file: bool = True) -> Path | None:
    """Write the leaderboard (and plot) into ``sweep_dir``; print it; return the best trial's config path."""
    sweep = Sweep(load_spec(sweep_dir), sweep_dir)
    table = rows(sweep)
    if not table:
        print(f"sweep: {sweep_dir} has no trials yet")
        return None
    write_csv(table, sweep_dir / "leaderboard.csv")
    write_markdown(table, sweep_dir / "leaderboard.md")
    written = [sweep_dir / "leaderboard.csv", sweep_dir / "leaderboard.md"]
    if plot_file:
        plot(sweep, sweep_dir / "leaderboard.png")
        written.append(sweep_dir / "leaderboard.png")
    print((sweep_dir / "leaderboard.md").read_text(), end="")
    print(f"sweep: wrote {', '.join(map(str, written))}")
    best = next((row for row in table if row["state"] == "complete"), None)
    if best is None:
        print("sweep: no trial is complete yet")
        return None
    config = Path(best["run_dir"]) / "config.yaml"
    print(f"best trial {best['trial']} ({sweep.spec.metric}={best[sweep.spec.metric]}): {config}")
    return config
