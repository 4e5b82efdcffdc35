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
from src.bench.startup import HELP_TARGET_RATIO
from src.bench.stats import aggregate, overhead, scaling_efficiency

#: ddp throughput must reach this share of plain PyTorch DDP's (a target of the project); at a small per-process
#: batch the fixed cost of a step weighs more: (workload, samples per process) -> a lower share there
DDP_TARGET, DDP_SMALL_BATCH_TARGETS = 0.98, {("image", 16): 0.93}
#: the template's loop (Lightning's and the template's) may cost this much per step over a plain loop
OVERHEAD_TARGET_MS, OVERHEAD_TARGET_PERCENT = 1.0, 3.0
#: the template's own cost over bare Lightning: per step at the tiny step (``--quick``), in % at the default workloads
TEMPLATE_TARGET_MS, TEMPLATE_TARGET_PERCENT = 0.3, 1.0
#: the 1-device row each implementation's scaling efficiency is measured against
ONE_DEVICE_ROW = {"template": "single", "bare": "bare-lightning", "plain": "plain-loop"}
DASH = "\u2013"  # an en dash: "no value" in the table


def _same_group(a: Row, b: Row) -> bool:
    return (a.workload, a.precision, a.batch_size) == (b.workload, b.precision, b.batch_size)


def _find(rows: list[Row], like: Row, strategy: str, devices: int) -> Row | None:
    return next((r for r in rows if _same_group(r, like) and r.strategy == strategy and r.devices == devices), None)


def reference_row(rows: list[Row], row: Row) -> Row | None:
    """The single-device row a row's scaling efficiency is measured against."""
    return _find(rows, row, ONE_DEVICE_ROW[row.implementation], 1)


def counterpart(rows: list[Row], row: Row, accelerator: str, baseline: str) -> Row | None:
    """The ``baseline`` row (``bare`` or ``plain``) doing the same work as ``row``; None where there is none.

    Multi-GPU ``dp`` has none (no baseline splits a batch over GPUs in one process), nor has a row of the
    baseline itself, and bare Lightning is compared with plain PyTorch only.
    """
    if row.implementation == baseline or (row.implementation == "bare" and baseline != "plain"):
        return None
    single, multi = ("bare-lightning", "bare-lightning-ddp") if baseline == "bare" else ("plain-loop", "plain-ddp")
    if row.strategy in ("ddp", "ddp_spawn", "fsdp2", "bare-lightning-ddp"):
        return _find(rows, row, multi, row.devices)
    one_process_dp = row.strategy == "dp" and (accelerator == "cpu" or row.devices == 1)
    if row.strategy in ("single", "bare-lightning") or one_process_dp:
        return _find(rows, row, single, 1)
    return None


def _same_losses(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether two rows trained the same thing: first and last losses equal to 0.1%."""
    if None in (a.get("loss_first"), a.get("loss_last"), b.get("loss_first"), b.get("loss_last")):
        return None
    return math.isclose(a["loss_first"], b["loss_first"], rel_tol=1e-3) and math.isclose(
        a["loss_last"], b["loss_last"], rel_tol=1e-3
    )


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
        entry["builtin"] = workload_info[row.workload].get("builtin", True)
        entry["note"] = note(row, accelerator)
        entry["status"] = entry.get("not_applicable") or (
            "ok" if entry.get("samples_per_s") is not None and not entry.get("error") else "failed"
        )
        info = workload_info[row.workload]
        throughput = entry.get("samples_per_s")
        tokens = info.get("tokens_per_sample")
        entry["tokens_per_s"] = throughput * tokens if throughput and tokens else None
        reference = reference_row(rows, row)
        entry["scaling_efficiency"] = scaling_efficiency(
            throughput, row.devices, figures[reference].get("samples_per_s") if reference else None
        )
        for baseline in ("plain", "bare"):
            other = counterpart(rows, row, accelerator, baseline)
            other = None if other and figures[other].get("not_applicable") else other  # a user's model: no plain row
            cost = overhead(figures[row], figures[other]) if other else None
            suffix = "" if baseline == "plain" else "_vs_bare"  # the columns over plain PyTorch keep their names
            entry[f"{baseline}_key"] = other.key if other else None
            entry[f"throughput_vs_{baseline}"] = cost["throughput_ratio"] if cost else None
            entry[f"overhead{suffix}_ms_per_step"] = cost["ms_per_step"] if cost else None
            entry[f"overhead{suffix}_percent"] = cost["percent"] if cost else None
            entry[f"overhead{suffix}_median_ms_per_step"] = cost["median_ms_per_step"] if cost else None
            entry[f"overhead{suffix}_cpu_ms_per_step"] = cost["cpu_ms_per_step"] if cost else None
            entry[f"same_loss_as_{baseline}"] = _same_losses(entry, figures[other]) if other else None
        flops = info.get("flops_per_sample")
        if not flops and info.get("flops_per_batch"):  # Lightning's convention: one micro-batch of one process
            flops = info["flops_per_batch"] / entry["per_process_batch"]
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
        *[f"- workload {name}: {info.get('description')}" for name, info in (results.get("workloads") or {}).items()],
        "",
        "Throughput is the global batch over the mean step time of the timed steps; step times are the median and"
        " interquartile range; efficiency is throughput / (devices x the single-device row of the same"
        " implementation); 'vs plain' is throughput relative to the plain PyTorch row doing the same work, and"
        " 'over plain' the extra mean step time (Lightning's and the template's); 'over bare Lightning' is the"
        " template's own extra mean step time over the bare Lightning row doing the same work.",
        "",
    ]
    header = (
        "| workload | implementation | devices (procs) | precision | batch (per proc) | samples/s | tokens/s |"
        " step ms median [IQR] | efficiency | vs plain | over plain ms/step | over bare Lightning ms/step (%) |"
        " first step s | peak mem/dev MB |"
        " TFLOP/s | MFU |"
    )
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for row in table:
        if row.get("not_applicable"):
            lines.append(
                f"| {row['workload']} | {row['label']} | {row['devices']} ({row['processes']}) | {row['precision']}"
                f" | {row['batch_size']} | {row['not_applicable']} |" + " |" * 10
            )
            continue
        if row.get("samples_per_s") is None:
            lines.append(
                f"| {row['workload']} | {row['label']} | {row['devices']} ({row['processes']}) | {row['precision']}"
                f" | {row['batch_size']} | {'FAILED: ' if row.get('error') != 'not run' else ''}{row.get('error')} |"
                + " |"
                * 10
            )
            continue
        label = row["label"] + (" ¹" if row["note"] else "")
        iqr = f"{row['step_ms_median']:.2f} [{row['step_ms_p25']:.2f}{DASH}{row['step_ms_p75']:.2f}]"
        lines.append(
            f"| {row['workload']} | {label} | {row['devices']} ({row['processes']}) | {row['precision']}"
            f" | {row['batch_size']} ({row['per_process_batch']}) | {_cell(row['samples_per_s'])}"
            f" | {_cell(row['tokens_per_s'], 0)} | {iqr} | {_percent(row['scaling_efficiency'])}"
            f" | {_percent(row['throughput_vs_plain'])} | {_cell(row['overhead_ms_per_step'], 2)}"
            f" | {_over_bare(row)}"
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
    lines += ["", *targets(table, quick=settings["quick"])]
    lines += startup_section(results.get("startup"), table)
    return "\n".join(lines) + "\n"


def _over_bare(row: dict[str, Any]) -> str:
    ms = row.get("overhead_vs_bare_ms_per_step")
    return DASH if ms is None else f"{ms:+.2f} ({row['overhead_vs_bare_percent']:+.1f}%)"


def startup_section(startup: dict[str, Any] | None, table: list[dict[str, Any]]) -> list[str]:
    """What a user waits for on every launch: ``--help``, and the time to the first training step."""
    if not startup:
        return []
    ratio = startup["help_vs_import"]
    lines = [
        "",
        "## Start-up",
        "",
        f"Median of {startup['repeats']} interleaved run(s), each in a fresh process:",
        "",
        f"- `python -m src.cli fit --help`: {startup['cli_help_s']:.2f} s",
        f'- `python -c "import lightning.pytorch"`: {startup["import_lightning_s"]:.2f} s',
        f"- ratio {ratio:.2f}: {'within' if ratio <= HELP_TARGET_RATIO else 'over'} the target"
        f" ({HELP_TARGET_RATIO:g}x)",
    ]
    for row in table:
        if row["strategy"] in ONE_DEVICE_ROW.values() and row.get("startup_s") is not None:
            lines.append(
                f"- time to the first training step, {row['workload']} b{row['batch_size']}, {row['label']}:"
                f" {row['startup_s']:.2f} s"
            )
    return lines


def targets(table: list[dict[str, Any]], quick: bool) -> list[str]:
    """The project's targets, checked against this run's rows.

    The template's own cost over bare Lightning is held to a per-step bound on the small ``--quick`` workloads
    (where a step is short enough for a fraction of a millisecond to show) and to a share on the default ones.
    The targets are set for the built-in workloads; a user's model gets the figures without a verdict.
    """
    lines = []
    for row in table:
        name = f"{row['workload']} {row['precision']} b{row['batch_size']} {row['label']} x{row['devices']}"
        same = ", same losses as {}".format
        ms, pct = row.get("overhead_vs_bare_ms_per_step"), row.get("overhead_vs_bare_percent")
        if row["strategy"] in ("single", "ddp") and ms is not None:
            ok = ms <= TEMPLATE_TARGET_MS if quick else pct <= TEMPLATE_TARGET_PERCENT
            target = f"{TEMPLATE_TARGET_MS:g} ms/step" if quick else f"{TEMPLATE_TARGET_PERCENT:g}%"
            verdict = f": {'within' if ok else 'over'} the target ({target})" if row.get("builtin", True) else ""
            lines.append(
                f"- {name}: the template over bare Lightning {ms:+.2f} ms/step ({pct:+.1f}%; main-thread CPU time"
                f" {_cell(row.get('overhead_vs_bare_cpu_ms_per_step'), 2)} ms){verdict}"
                + (same("bare Lightning") if row.get("same_loss_as_bare") else "")
            )
        ms, pct = row.get("overhead_ms_per_step"), row.get("overhead_percent")
        if row["strategy"] == "single" and ms is not None:
            ok = ms <= OVERHEAD_TARGET_MS and pct <= OVERHEAD_TARGET_PERCENT
            lines.append(
                f"- {name}: the template's loop over the plain loop {ms:+.2f} ms/step ({pct:+.1f}%; median step"
                f" {row['overhead_median_ms_per_step']:+.2f} ms; main-thread CPU time"
                f" {_cell(row.get('overhead_cpu_ms_per_step'), 2)} ms): {'within' if ok else 'over'} the targets"
                f" ({OVERHEAD_TARGET_MS:g} ms, {OVERHEAD_TARGET_PERCENT:g}%)"
                + (same("plain") if row.get("same_loss_as_plain") else "")
            )
        ratio = row.get("throughput_vs_plain")
        if row["strategy"] == "ddp" and ratio is not None:
            target = ddp_target(row)
            plain = next((r for r in table if r["key"] == row["plain_key"]), {})
            lines.append(
                f"- {name}: {100 * ratio:.1f}% of plain DDP's throughput ({'meets' if ratio >= target else 'misses'}"
                f" {100 * target:.0f}%); scaling efficiency {_percent(row['scaling_efficiency'])} vs plain DDP's"
                f" {_percent(plain.get('scaling_efficiency'))}"
                + (same("plain") if row.get("same_loss_as_plain") else "")
            )
    return ["## Targets", "", *lines] if lines else []


def ddp_target(row: dict[str, Any]) -> float:
    """The share of plain DDP's throughput a ``ddp`` row must reach."""
    return DDP_SMALL_BATCH_TARGETS.get((row["workload"], row["per_process_batch"]), DDP_TARGET)


def write_csv(path: Path, table: list[dict[str, Any]]) -> None:
    """One line per row, every figure of ``build_table`` a column (lists joined with ``|``)."""
    fields = list(dict.fromkeys(key for row in table for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
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
            if r["strategy"] in ONE_DEVICE_ROW.values() and r.get("samples_per_s")
        }
        for strategy, label in STRATEGY_LABELS.items():
            points = sorted(
                (r["devices"], r["samples_per_s"]) for r in rows if r["strategy"] == strategy and r.get("samples_per_s")
            )
            if not points:
                continue
            implementation = Row(workload, strategy, 1, precision, batch).implementation
            reference = one_device.get(ONE_DEVICE_ROW[implementation])
            if strategy not in one_device and points[0][0] > 1 and reference:
                points.insert(0, (1, reference))  # each line starts from its implementation's 1-device row
            style = {"plain": "--", "bare": "-."}.get(implementation, "-")
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
