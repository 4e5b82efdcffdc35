"""The benchmark's two plots: throughput against device count, and each template row against plain PyTorch.

Drawn from the rows of ``report.build_table`` with matplotlib (``pip install matplotlib``, or ``.[bench]``),
which is imported here only: without it the benchmark writes its tables and says that the plots were skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.runner import ONE_DEVICE_ROW, STRATEGY_LABELS, Row


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _groups(table: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(workload, precision, global batch) of the rows, in order: one panel each."""
    return list(dict.fromkeys((row["workload"], row["precision"], row["batch_size"]) for row in table))


def _plot_group(ax: Any, rows: list[dict[str, Any]], precision: str, batch: int) -> None:
    """One panel: a line per strategy, each from its implementation's 1-device row, and linear scaling."""
    measured = [r for r in rows if r.get("samples_per_s")]
    one_device = {r["strategy"]: r["samples_per_s"] for r in measured if r["strategy"] in ONE_DEVICE_ROW.values()}
    for strategy, label in STRATEGY_LABELS.items():
        points = sorted((r["devices"], r["samples_per_s"]) for r in measured if r["strategy"] == strategy)
        if not points:
            continue
        implementation = Row(rows[0]["workload"], strategy, 1, precision, batch).implementation
        reference = one_device.get(ONE_DEVICE_ROW[implementation])
        if strategy not in one_device and points[0][0] > 1 and reference:
            points.insert(0, (1, reference))  # each line starts from its implementation's 1-device row
        style = {"plain": "--", "bare": "-."}.get(implementation, "-")
        ax.plot(*zip(*points, strict=True), style, marker="s" if strategy in one_device else "o", label=label)
    counts = sorted({r["devices"] for r in rows})
    for strategy, color in (("plain-loop", "grey"), ("single", "black")):
        if one_device.get(strategy) and len(counts) > 1:
            linear = [one_device[strategy] * n for n in counts]
            ax.plot(counts, linear, ":", color=color, linewidth=1, label=f"linear ({strategy})")
    ax.set_xticks(counts)
    ax.set_xlabel("devices (processes for ddp; GPUs for dp)")
    ax.set_ylabel("samples/s")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot_scaling(table: list[dict[str, Any]], path: Path) -> None:
    """Throughput against device count, one panel per workload, precision and batch."""
    plt = _pyplot()
    groups = _groups(table)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, (workload, precision, batch) in zip(axes[0], groups, strict=True):
        rows = [r for r in table if (r["workload"], r["precision"], r["batch_size"]) == (workload, precision, batch)]
        _plot_group(ax, rows, precision, batch)
        ax.set_title(f"{workload}, {precision}, global batch {batch}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_plain(table: list[dict[str, Any]], path: Path) -> None:
    """Each template row's throughput relative to the plain PyTorch row doing the same work."""
    plt = _pyplot()
    rows = [r for r in table if r.get("throughput_vs_plain")]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(rows), 2) + 1.5))
    labels = [f"{r['workload']} {r['precision']} b{r['batch_size']}: {r['label']} x{r['devices']}" for r in rows]
    values = [100 * r["throughput_vs_plain"] for r in rows]
    bars = ax.barh(range(len(rows)), values, color="tab:blue")
    for bar, row in zip(bars, rows, strict=True):
        text = f" {100 * row['throughput_vs_plain']:.1f}%  ({row['overhead_ms_per_step']:+.2f} ms/step)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=7)
    ax.axvline(100, color="black", linewidth=1, label="plain PyTorch")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(min([80.0, *values]) - 5, max([105.0, *values]) + 30)  # room for the labels
    ax.set_xlabel("throughput relative to plain PyTorch (%)")
    ax.set_title("Template vs plain PyTorch: same model, data, batch and threads", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(table: list[dict[str, Any]], out: Path) -> list[Path]:
    """Both plots in ``out``; none (and a line saying why) without matplotlib."""
    paths = [out / "throughput_vs_devices.png", out / "lightning_vs_plain.png"]
    try:
        plot_scaling(table, paths[0])
        plot_vs_plain(table, paths[1])
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    return paths
