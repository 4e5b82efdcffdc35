"""The benchmark's outputs: derived figures per row, then JSON, CSV, a Markdown report and PNG plots.

``python -m src.bench.report DIR`` rewrites the report and plots from ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

from src.bench.runner import STRATEGY_LABELS, Row, note, row_dict
from src.bench.stats import aggregate, overhead, scaling_efficiency

#: ddp throughput must reach this share of plain PyTorch DDP's (the issue's target)
DDP_TARGET = 0.97
#: the template's loop may cost this much per step over a plain loop (the issue's targets)
OVERHEAD_TARGET_MS, OVERHEAD_TARGET_PERCENT = 1.0, 3.0
DASH = "\u2013"  # an en dash: "no value" in the table

CSV_FIELDS = [
    "key", "workload", "implementation", "strategy", "devices", "processes", "precision", "batch_size",
    "per_process_batch", "threads_per_process", "samples_per_s", "samples_per_s_min", "samples_per_s_max",
    "tokens_per_s", "step_ms_median", "step_ms_p25", "step_ms_p75", "step_ms_mean", "cpu_ms_mean", "cpu_share",
    "scaling_efficiency", "throughput_vs_plain", "overhead_ms_per_step", "overhead_percent",
    "overhead_cpu_ms_per_step", "startup_s", "peak_memory_mb", "memory_kind", "tflops", "mfu",
    "peak_tflops_per_device", "repeats_ok", "repeats", "loss_first", "loss_last", "note", "error",
]  # fmt: skip


def _same_group(a: Row, b: Row) -> bool:
    return (a.workload, a.precision, a.batch_size) == (b.workload, b.precision, b.batch_size)


def _find(rows: list[Row], like: Row, strategy: str, devices: int) -> Row | None:
    return next((r for r in rows if _same_group(r, like) and r.strategy == strategy and r.devices == devices), None)


def reference_row(rows: list[Row], row: Row) -> Row | None:
    """The single-device row a row's scaling efficiency is measured against."""
    return _find(rows, row, "plain-loop" if row.implementation == "plain" else "single", 1)


def plain_counterpart(rows: list[Row], row: Row, accelerator: str) -> Row | None:
    """The baseline that does the same work as a template row (None for multi-GPU dp and plain rows)."""
    if row.strategy in ("ddp", "ddp_spawn"):
        return _find(rows, row, "plain-ddp", row.devices)
    if row.strategy == "single" or (row.strategy == "dp" and (accelerator == "cpu" or row.devices == 1)):
        return _find(rows, row, "plain-loop", 1)
    return None


def build_table(
    results: dict[Row, list[dict[str, Any]]],
    accelerator: str,
    workload_info: dict[str, dict[str, Any]],
    peaks: dict[str, float | None],
) -> list[dict[str, Any]]:
    """One dict per row: the medians over repeats and the figures derived from other rows."""
    rows = list(results)
    figures = {row: aggregate(runs) for row, runs in results.items()}
    table = []
    for row in rows:
        entry: dict[str, Any] = {**row_dict(row), "label": STRATEGY_LABELS[row.strategy], **figures[row]}
        entry["per_process_batch"] = row.batch_size // row.processes
        entry["note"] = note(row, accelerator)
        info = workload_info[row.workload]
        throughput = entry.get("samples_per_s")
        tokens = info.get("tokens_per_sample")
        entry["tokens_per_s"] = throughput * tokens if throughput and tokens else None
        reference = reference_row(rows, row)
        entry["scaling_efficiency"] = scaling_efficiency(
            throughput, row.devices, figures[reference].get("samples_per_s") if reference else None
        )
        counterpart = plain_counterpart(rows, row, accelerator)
        entry["plain_key"] = counterpart.key if counterpart else None
        cost = overhead(figures[row], figures[counterpart]) if counterpart else None
        entry["throughput_vs_plain"] = cost["throughput_ratio"] if cost else None
        entry["overhead_ms_per_step"] = cost["ms_per_step"] if cost else None
        entry["overhead_percent"] = cost["percent"] if cost else None
        entry["overhead_median_ms_per_step"] = cost["median_ms_per_step"] if cost else None
        entry["overhead_cpu_ms_per_step"] = cost["cpu_ms_per_step"] if cost else None
        if counterpart and figures[counterpart].get("loss_last") is not None and entry.get("loss_last") is not None:
            a, b = entry["loss_last"], figures[counterpart]["loss_last"]
            entry["same_loss_as_plain"] = math.isclose(a, b, rel_tol=1e-3) and math.isclose(
                entry["loss_first"], figures[counterpart]["loss_first"], rel_tol=1e-3
            )
        flops = info.get("flops_per_sample")
        peak = peaks.get(row.precision)
        gpus = row.devices if accelerator == "gpu" else 0
        entry["tflops"] = throughput * flops / 1e12 if throughput and flops and gpus else None
        entry["peak_tflops_per_device"] = peak / 1e12 if peak else None
        entry["mfu"] = entry["tflops"] * 1e12 / (peak * gpus) if entry["tflops"] and peak else None
        table.append(entry)
    return table


# -- files ---------------------------------------------------------------------------------------------------


def _cell(value: Any, digits: int = 1) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _percent(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.2f}%"  # small MFUs keep two decimals


def markdown(results: dict[str, Any]) -> str:
    """The report: environment, settings, the table, and the targets checked."""
    env, settings, table = results["environment"], results["settings"], results["rows"]
    lines = [
        "# Strategy benchmark",
        "",
        f"`{env['command']}`",
        "",
        f"- machine: {env['cpu']}, {env['cpu_cores']} cores ({env['cpu_cores_usable']} usable),"
        f" {env['memory_gib']} GiB; GPUs: {', '.join(env['gpus']) or 'none'}",
        f"- software: Python {env['python']}, torch {env['torch']}, lightning {env['lightning']},"
        f" torchmetrics {env['torchmetrics']}; git {env['git_commit'] or 'n/a'}"
        + (" (with uncommitted changes)" if env["git_commit"] and env["git_dirty"] else ""),
        f"- load average (1, 5, 15 min) at start {env['load_average_start']}, at end {env.get('load_average_end')}",
        f"- settings: accelerator {settings['accelerator']}, {settings['threads']} thread(s) per process"
        f" (OMP_NUM_THREADS), {settings['warmup']} warm-up + {settings['steps']} timed steps per run,"
        f" median of {settings['repeats']} repeat(s), workloads {'quick' if settings['quick'] else 'default'}",
        "",
        "Throughput is the global batch over the mean step time of the timed steps; step times are the median and"
        " interquartile range; efficiency is throughput / (devices x the single-device row of the same"
        " implementation); 'vs plain' is throughput relative to the plain PyTorch row doing the same work.",
        "",
    ]
    header = (
        "| workload | implementation | devices (procs) | precision | batch (per proc) | samples/s | tokens/s |"
        " step ms median [IQR] | efficiency | vs plain | overhead ms/step | first step s | peak mem/dev MB |"
        " TFLOP/s | MFU |"
    )
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for row in table:
        if row.get("samples_per_s") is None:
            lines.append(
                f"| {row['workload']} | {row['label']} | {row['devices']} ({row['processes']}) | {row['precision']}"
                f" | {row['batch_size']} | {'FAILED: ' if row.get('error') != 'not run' else ''}{row.get('error')} |"
                + " |"
                * 9
            )
            continue
        label = row["label"] + (" ¹" if row["note"] else "")
        iqr = f"{row['step_ms_median']:.2f} [{row['step_ms_p25']:.2f}{DASH}{row['step_ms_p75']:.2f}]"
        lines.append(
            f"| {row['workload']} | {label} | {row['devices']} ({row['processes']}) | {row['precision']}"
            f" | {row['batch_size']} ({row['per_process_batch']}) | {_cell(row['samples_per_s'])}"
            f" | {_cell(row['tokens_per_s'], 0)} | {iqr} | {_percent(row['scaling_efficiency'])}"
            f" | {_percent(row['throughput_vs_plain'])} | {_cell(row['overhead_ms_per_step'], 2)}"
            f" | {_cell(row['startup_s'])} | {_cell(row['peak_memory_mb'], 0)} | {_cell(row['tflops'], 2)}"
            f" | {_percent(row['mfu']) if row['mfu'] is not None else DASH} |"
        )
    notes = sorted({row["note"] for row in table if row.get("note")})
    if notes:
        lines += ["", *[f"¹ {text}" for text in notes]]
    kinds = {row.get("memory_kind") for row in table}
    memory = {
        "max_rss": "the peak resident set of each process (all of it: Python, libraries, data)",
        "cuda_max_allocated": "the peak of PyTorch's CUDA allocator on each GPU (torch.cuda.max_memory_allocated)",
    }
    lines += ["", "Peak memory per device: " + "; ".join(text for kind, text in memory.items() if kind in kinds) + "."]
    lines += ["", *targets(table)]
    return "\n".join(lines) + "\n"


def targets(table: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, checked against this run's rows."""
    lines = ["## Targets", ""]
    for row in table:
        if row["strategy"] == "single" and row.get("overhead_ms_per_step") is not None:
            ms, pct = row["overhead_ms_per_step"], row["overhead_percent"]
            ok = ms <= OVERHEAD_TARGET_MS and pct <= OVERHEAD_TARGET_PERCENT
            lines.append(
                f"- {row['workload']} {row['precision']} b{row['batch_size']}: template loop over plain loop"
                f" {ms:+.2f} ms/step ({pct:+.1f}%; median step {row['overhead_median_ms_per_step']:+.2f} ms;"
                f" main-thread CPU time {_cell(row.get('overhead_cpu_ms_per_step'), 2)} ms):"
                f" {'within' if ok else 'over'} the targets ({OVERHEAD_TARGET_MS:g} ms, {OVERHEAD_TARGET_PERCENT:g}%)"
                + (", same losses as plain" if row.get("same_loss_as_plain") else "")
            )
    for row in table:
        if row["strategy"] == "ddp" and row.get("throughput_vs_plain") is not None:
            ratio = row["throughput_vs_plain"]
            plain = next((r for r in table if r["key"] == row["plain_key"]), {})
            lines.append(
                f"- {row['workload']} {row['precision']} b{row['batch_size']} ddp x{row['devices']}:"
                f" {100 * ratio:.1f}% of plain DDP's throughput ({'meets' if ratio >= DDP_TARGET else 'misses'}"
                f" {100 * DDP_TARGET:.0f}%); scaling efficiency {_percent(row['scaling_efficiency'])}"
                f" vs plain DDP's {_percent(plain.get('scaling_efficiency'))}"
                + (", same losses as plain" if row.get("same_loss_as_plain") else "")
            )
    return lines if len(lines) > 2 else []


def write_csv(path: Path, table: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in table:
            writer.writerow({k: ("|".join(map(str, v)) if isinstance(v, list) else v) for k, v in row.items()})


# -- plots ---------------------------------------------------------------------------------------------------


def _groups(table: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    seen: list[tuple[str, str, int]] = []
    for row in table:
        group = (row["workload"], row["precision"], row["batch_size"])
        if group not in seen:
            seen.append(group)
    return seen


def plot_scaling(table: list[dict[str, Any]], path: Path) -> None:
    """Throughput against device count, one line per strategy, with linear scaling from each 1-device row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(table)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, (workload, precision, batch) in zip(axes[0], groups, strict=True):
        rows = [r for r in table if (r["workload"], r["precision"], r["batch_size"]) == (workload, precision, batch)]
        one_device = {
            r["strategy"]: r["samples_per_s"]
            for r in rows
            if r["strategy"] in ("single", "plain-loop") and r.get("samples_per_s")
        }
        for strategy, label in STRATEGY_LABELS.items():
            points = sorted(
                (r["devices"], r["samples_per_s"]) for r in rows if r["strategy"] == strategy and r.get("samples_per_s")
            )
            if not points:
                continue
            reference = one_device.get("plain-loop" if strategy.startswith("plain") else "single")
            if strategy not in one_device and points[0][0] > 1 and reference:
                points.insert(0, (1, reference))  # each line starts from its implementation's 1-device row
            style = "--" if strategy.startswith("plain") else "-"
            marker = "s" if strategy in one_device else "o"
            ax.plot(*zip(*points, strict=True), style, marker=marker, label=label)
        counts = sorted({r["devices"] for r in rows})
        for strategy, color in (("plain-loop", "grey"), ("single", "black")):
            one = next((r["samples_per_s"] for r in rows if r["strategy"] == strategy and r.get("samples_per_s")), None)
            if one and len(counts) > 1:
                ax.plot(counts, [one * n for n in counts], ":", color=color, linewidth=1, label=f"linear ({strategy})")
        ax.set_xticks(counts)
        ax.set_xlabel("devices (processes for ddp; GPUs for dp)")
        ax.set_ylabel("samples/s")
        ax.set_title(f"{workload}, {precision}, global batch {batch}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_plain(table: list[dict[str, Any]], path: Path) -> None:
    """Each template row's throughput relative to the plain PyTorch row doing the same work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r.get("throughput_vs_plain")]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(rows), 2) + 1.5))
    labels = [f"{r['workload']} {r['precision']} b{r['batch_size']}: {r['label']} x{r['devices']}" for r in rows]
    values = [100 * r["throughput_vs_plain"] for r in rows]
    colors = ["tab:blue" if v >= 100 * DDP_TARGET else "tab:orange" for v in values]
    bars = ax.barh(range(len(rows)), values, color=colors)
    for bar, row in zip(bars, rows, strict=True):
        text = f" {100 * row['throughput_vs_plain']:.1f}%  ({row['overhead_ms_per_step']:+.2f} ms/step)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=7)
    ax.axvline(100, color="black", linewidth=1)
    ax.axvline(100 * DDP_TARGET, color="tab:red", linestyle="--", linewidth=1, label=f"{100 * DDP_TARGET:.0f}% target")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(min([80.0, *values]) - 5, max([105.0, *values]) + 30)  # room for the labels
    ax.set_xlabel("throughput relative to plain PyTorch (%)")
    ax.set_title("Template vs plain PyTorch: same model, data, batch and threads", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(out: Path, results: dict[str, Any], plots: bool = True) -> list[Path]:
    """Write ``results.json``, ``results.csv``, ``results.md`` and (with matplotlib) the two plots."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.csv", out / "results.md"]
    written[0].write_text(json.dumps(results, indent=1, default=str))
    write_csv(written[1], results["rows"])
    written[2].write_text(markdown(results))
    if plots:
        try:
            plot_scaling(results["rows"], out / "throughput_vs_devices.png")
            plot_vs_plain(results["rows"], out / "lightning_vs_plain.png")
            written += [out / "throughput_vs_devices.png", out / "lightning_vs_plain.png"]
        except ImportError:
            print("matplotlib is not installed: no plots (pip install matplotlib)")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m src.bench.report", description="Rewrite a benchmark's report.")
    parser.add_argument("out", type=Path, help="folder with results.json")
    args = parser.parse_args(argv)
    results = json.loads((args.out / "results.json").read_text())
    for path in write_all(args.out, results):
        print(path)


if __name__ == "__main__":
    main()
