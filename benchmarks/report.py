"""The benchmark's outputs: the figures derived per row, then JSON, CSV and a Markdown report (plots: ``plots.py``).

The report states what was measured, without verdicts: the project's own targets, and how this template's runs
compare with them, are in ``docs/benchmarks.md``. ``python -m benchmarks.report DIR`` rewrites the report and
plots from ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.runner import ONE_DEVICE_ROW, STRATEGY_LABELS, Row, note, pipeline_shape, row_dict, theoretical_bubble
from benchmarks.stats import aggregate, overhead, scaling_efficiency

DASH = "\u2013"  # an en dash: "no value" in the table
#: what each kind of peak memory is (``memory_kind``: the figure of the template's probe)
MEMORY_KINDS = {
    "perf/memory_rss_gb": "the peak resident set of each process (all of it: Python, libraries, data)",
    "perf/memory_allocated_gb": "the peak of PyTorch's CUDA allocator on each GPU (torch.cuda.max_memory_allocated)",
}
#: the columns of the table, after the row's identity (workload, implementation, devices, precision, batch)
FIGURE_COLUMNS = (
    "samples/s | tokens/s | step ms median [IQR] | efficiency | vs plain | over plain ms/step"
    " | over bare Lightning ms/step (%) | first step s | peak mem/dev MB | state/rank MB | TFLOP/s | MFU"
)
#: the column ``--memory-budget-mb`` adds after the figures
BUDGET_COLUMN = "budget"
OVER_BUDGET = "over budget"


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
    if row.strategy in ("tensor_parallel", "pipeline"):  # one model replica on the whole batch, as one device
        return _find(rows, row, single, 1)
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


def _against(entry: dict[str, Any], baseline: str, other: Row | None, figures: dict[str, Any] | None) -> None:
    """The columns of ``entry`` that compare it with its ``baseline`` row ``other`` (all None where none)."""
    cost = overhead(entry, figures) if figures else None
    suffix = "" if baseline == "plain" else "_vs_bare"  # the columns over plain PyTorch keep their first names
    entry[f"{baseline}_key"] = other.key if other else None
    entry[f"throughput_vs_{baseline}"] = cost["throughput_ratio"] if cost else None
    for figure in ("ms_per_step", "percent", "median_ms_per_step", "cpu_ms_per_step"):
        entry[f"overhead{suffix}_{figure}"] = cost[figure] if cost else None
    entry[f"same_loss_as_{baseline}"] = _same_losses(entry, figures) if figures else None


def _flops(entry: dict[str, Any], info: dict[str, Any], peak: float | None, gpus: int) -> None:
    """TFLOP/s and MFU of a GPU row whose workload counts its FLOPs (None elsewhere)."""
    flops = info.get("flops_per_sample")
    if not flops and info.get("flops_per_batch"):  # Lightning's convention: one micro-batch of one process
        flops = info["flops_per_batch"] / entry["per_process_batch"]
    throughput = entry.get("samples_per_s")
    entry["tflops"] = throughput * flops / 1e12 if throughput and flops and gpus else None
    entry["peak_tflops_per_device"] = peak / 1e12 if peak else None
    entry["mfu"] = entry["tflops"] * 1e12 / (peak * gpus) if entry["tflops"] and peak else None


def fits(state_mb: float | None, budget_mb: float | None) -> bool | None:
    """Whether a rank's parameters + gradients + optimizer state fit the budget; None without either figure."""
    return None if state_mb is None or budget_mb is None else state_mb <= budget_mb


def build_table(
    results: dict[Row, list[dict[str, Any]]],
    accelerator: str,
    workload_info: dict[str, dict[str, Any]],
    peaks: dict[str, float | None],
    memory_budget_mb: float | None = None,
) -> list[dict[str, Any]]:
    """One dict per row: the medians over repeats and the figures derived from other rows.

    ``memory_budget_mb``: each row's ``fits_budget`` says whether the model state one rank holds fits it.
    """
    rows = list(results)
    figures = {row: aggregate(runs) for row, runs in results.items()}
    table = []
    for row in rows:
        info = workload_info[row.workload]
        entry: dict[str, Any] = {**row_dict(row), "label": STRATEGY_LABELS[row.strategy], **figures[row]}
        # the ranks of one tensor-parallel group (one node: all of them) share each sample
        shared = row.strategy in ("tensor_parallel", "pipeline")  # every rank of the group sees each sample
        entry["per_process_batch"] = row.batch_size // (1 if shared else row.processes)
        entry["memory_budget_mb"] = memory_budget_mb
        entry["fits_budget"] = fits(entry.get("state_mb_per_rank"), memory_budget_mb)
        entry["builtin"] = info.get("builtin", True)
        entry["note"] = note(row, accelerator)
        entry["bubble_theory"] = theoretical_bubble(row)
        entry["pipeline_stages"], entry["micro_batches"] = (
            pipeline_shape(row) if row.strategy == "pipeline" else (None, None)
        )
        measured = entry.get("samples_per_s") is not None and not entry.get("error")
        entry["status"] = entry.get("not_applicable") or ("ok" if measured else "failed")
        throughput, tokens = entry.get("samples_per_s"), info.get("tokens_per_sample")
        entry["tokens_per_s"] = throughput * tokens if throughput and tokens else None
        reference = reference_row(rows, row)
        reference_throughput = figures[reference].get("samples_per_s") if reference else None
        entry["scaling_efficiency"] = scaling_efficiency(throughput, row.devices, reference_throughput)
        for baseline in ("plain", "bare"):
            other = counterpart(rows, row, accelerator, baseline)
            other = None if other and figures[other].get("not_applicable") else other  # a user's model: no plain row
            _against(entry, baseline, other, figures[other] if other else None)
        _flops(entry, info, peaks.get(row.precision), row.devices if accelerator == "gpu" else 0)
        table.append(entry)
    return table


# -- the Markdown report -------------------------------------------------------------------------------------


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


def _over_bare(row: dict[str, Any]) -> str:
    ms = row.get("overhead_vs_bare_ms_per_step")
    return DASH if ms is None else f"{ms:+.2f} ({row['overhead_vs_bare_percent']:+.1f}%)"


def environment_lines(results: dict[str, Any]) -> list[str]:
    """The command, machine, software, load, settings and workloads of a run, one bullet each."""
    env, settings = results["environment"], results["settings"]
    dirty = " (with uncommitted changes)" if env["git_commit"] and env["git_dirty"] else ""
    return [
        f"`{env['command']}`",
        "",
        f"- machine: {env['cpu']}, {env['cpu_cores']} cores ({env['cpu_cores_usable']} usable),"
        f" {env['memory_gib']} GiB; GPUs: {', '.join(env['gpus']) or 'none'}",
        f"- software: Python {env['python']}, torch {env['torch']}, lightning {env['lightning']},"
        f" torchmetrics {env['torchmetrics']}; git {env['git_commit'] or 'n/a'}{dirty}",
        f"- load average (1, 5, 15 min) at start {env['load_average_start']}, at end {env.get('load_average_end')}",
        f"- settings: accelerator {settings['accelerator']}, {settings['threads']} thread(s) per process"
        f" (OMP_NUM_THREADS), {settings['warmup']} warm-up + {settings['steps']} timed steps per run,"
        f" median of {settings['repeats']} repeat(s), workloads {'quick' if settings['quick'] else 'default'}",
        *[f"- workload {name}: {info.get('description')}" for name, info in (results.get("workloads") or {}).items()],
    ]


def _budget(row: dict[str, Any]) -> str:
    fit = row.get("fits_budget")
    return DASH if fit is None else "fits" if fit else OVER_BUDGET


def table_line(row: dict[str, Any], budget: bool = False) -> str:
    """One row of the report's table: its figures, or why it has none (n/a, failed); ``budget``: with the column
    that says whether it fits the memory budget."""
    who = f"| {row['workload']} | {row['label']}{' ¹' if row['note'] else ''} | {row['devices']} ({row['processes']})"
    who += f" | {row['precision']} | {row['batch_size']}"
    if row.get("not_applicable") or row.get("samples_per_s") is None:
        failed = "FAILED: " if not row.get("not_applicable") and row.get("error") != "not run" else ""
        return f"{who} | {failed}{row.get('not_applicable') or row.get('error')} |" + " |" * (11 + budget)
    iqr = f"{row['step_ms_median']:.2f} [{row['step_ms_p25']:.2f}{DASH}{row['step_ms_p75']:.2f}]"
    cells = [
        _cell(row["samples_per_s"]),
        _cell(row["tokens_per_s"], 0),
        iqr,
        _percent(row["scaling_efficiency"]),
        _percent(row["throughput_vs_plain"]),
        _cell(row["overhead_ms_per_step"], 2),
        _over_bare(row),
        _cell(row["startup_s"]),
        _cell(row["peak_memory_mb"], 0),
        _cell(row.get("state_mb_per_rank"), 2),
        _cell(row["tflops"], 2),
        _percent(row["mfu"]),
        *([_budget(row)] if budget else []),
    ]
    return f"{who} ({row['per_process_batch']}) | " + " | ".join(cells) + " |"


def comparisons(table: list[dict[str, Any]]) -> list[str]:
    """The template against its baselines, row by row: its own cost over bare Lightning, the loop's over the
    plain loop, and ``ddp`` against plain DDP, each with whether the two trained the same thing."""
    lines = []
    for row in table:
        name = f"- {row['workload']} {row['precision']} b{row['batch_size']} {row['label']} x{row['devices']}"
        same = ", same losses as {}".format
        ms, pct = row.get("overhead_vs_bare_ms_per_step"), row.get("overhead_vs_bare_percent")
        if row["strategy"] in ("single", "ddp") and ms is not None:
            lines.append(
                f"{name}: the template over bare Lightning {ms:+.2f} ms/step ({pct:+.1f}%; main-thread CPU time"
                f" {_cell(row.get('overhead_vs_bare_cpu_ms_per_step'), 2)} ms)"
                + (same("bare Lightning") if row.get("same_loss_as_bare") else "")
            )
        ms, pct = row.get("overhead_ms_per_step"), row.get("overhead_percent")
        if row["strategy"] == "single" and ms is not None:
            lines.append(
                f"{name}: the template's loop over the plain loop {ms:+.2f} ms/step ({pct:+.1f}%; median step"
                f" {row['overhead_median_ms_per_step']:+.2f} ms; main-thread CPU time"
                f" {_cell(row.get('overhead_cpu_ms_per_step'), 2)} ms)"
                + (same("plain") if row.get("same_loss_as_plain") else "")
            )
        ratio = row.get("throughput_vs_plain")
        if row["strategy"] == "ddp" and ratio is not None:
            plain = next((r for r in table if r["key"] == row["plain_key"]), {})
            lines.append(
                f"{name}: {100 * ratio:.1f}% of plain DDP's throughput; scaling efficiency"
                f" {_percent(row['scaling_efficiency'])} vs plain DDP's {_percent(plain.get('scaling_efficiency'))}"
                + (same("plain") if row.get("same_loss_as_plain") else "")
            )
        same_run = ("workload", "devices", "precision", "batch_size")
        ddp = next((r for r in table if r["strategy"] == "ddp" and all(r[k] == row[k] for k in same_run)), {})
        state, ddp_state, ddp_ms = row.get("state_mb_per_rank"), ddp.get("state_mb_per_rank"), ddp.get("step_ms_median")
        if row["strategy"] in ("fsdp2", "tensor_parallel", "pipeline") and state and ddp_state and ddp_ms:
            lines.append(
                f"{name}: {state:.2f} MB of model state per rank, {100 * state / ddp_state:.0f}% of ddp's"
                f" {ddp_state:.2f} MB; median step {row['step_ms_median']:.2f} ms vs ddp's {ddp_ms:.2f} ms"
            )
    return ["## The template against its baselines", "", *lines] if lines else []


def bubble_section(table: list[dict[str, Any]]) -> list[str]:
    """The pipeline rows' bubble: in theory, and as measured per rank."""
    lines = []
    for row in table:
        if row.get("bubble_theory") is None:
            continue
        name = f"{row['workload']} {row['precision']} b{row['batch_size']} {row['label']} x{row['devices']}"
        shape = f"{row['pipeline_stages']} stages, {row['micro_batches']} micro-batches"
        line = f"- {name}: theory {100 * row['bubble_theory']:.0f}% ({shape})"
        if row.get("bubble_measured") is None:
            lines.append(f"{line}; not measured ({row.get('error') or row.get('not_applicable') or 'no timed steps'})")
            continue
        line += (
            f"; measured {100 * row['bubble_measured']:.0f}% [{100 * row['bubble_p25']:.0f}{DASH}"
            f"{100 * row['bubble_p75']:.0f}%], "
            + ", ".join(f"stage {i} {100 * share:.0f}%" for i, share in enumerate(row["bubble_per_stage"]))
        )
        if row["repeats_ok"] > 1:
            line += (
                f"; {row['repeats_ok']} repeats from {100 * row['bubble_measured_min']:.0f}% to"
                f" {100 * row['bubble_measured_max']:.0f}%"
            )
        lines.append(line)
    if not lines:
        return []
    return [
        "",
        "## Pipeline bubble",
        "",
        "The share of the pipelined part of a step (from the batch's start to the optimizer step) in which a stage"
        " waits for its neighbours instead of running its forwards and backwards: in theory (stages - 1) /"
        " (micro_batches + stages - 1), for stages of equal time and nothing else to wait for; measured on each"
        " rank as 1 - (its stage's forward and backward time) / (the pipelined part's time), the median over the"
        " timed steps of the ranks' mean [interquartile range], then each stage's median.",
        "",
        *lines,
    ]


def startup_section(startup: dict[str, Any] | None, table: list[dict[str, Any]]) -> list[str]:
    """What a user waits for on every launch: ``--help``, and the time to the first training step."""
    if not startup:
        return []
    lines = [
        "",
        "## Start-up",
        "",
        f"Median of {startup['repeats']} interleaved run(s), each in a fresh process:",
        "",
        f"- `python -m src.cli fit --help`: {startup['cli_help_s']:.2f} s",
        f'- `python -c "import lightning.pytorch"`: {startup["import_lightning_s"]:.2f} s',
        f"- `--help` over the import: {startup['help_vs_import']:.2f}x",
    ]
    for row in table:
        if row["strategy"] in ONE_DEVICE_ROW.values() and row.get("startup_s") is not None:
            lines.append(
                f"- time to the first training step, {row['workload']} b{row['batch_size']}, {row['label']}:"
                f" {row['startup_s']:.2f} s"
            )
    return lines


def markdown(results: dict[str, Any]) -> str:
    """The report: environment and settings, the table, the template against its baselines, and start-up."""
    table = results["rows"]
    budget = results["settings"].get("memory_budget_mb")
    columns = FIGURE_COLUMNS + (f" | {BUDGET_COLUMN} {budget:g} MB" if budget is not None else "")
    header = f"| workload | implementation | devices (procs) | precision | batch (per proc) | {columns} |"
    notes = sorted({row["note"] for row in table if row.get("note")})
    kinds = {row.get("memory_kind") for row in table}
    lines = [
        "# Strategy benchmark",
        "",
        *environment_lines(results),
        "",
        "Throughput is the global batch over the mean step time of the timed steps; step times are the median and"
        " interquartile range; efficiency is throughput / (devices x the single-device row of the same"
        " implementation); 'vs plain' is throughput relative to the plain PyTorch row doing the same work, and"
        " 'over plain' the extra mean step time (Lightning's and the template's); 'over bare Lightning' is the"
        " template's own extra mean step time over the bare Lightning row doing the same work.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *[table_line(row, budget is not None) for row in table],
        *(["", *[f"¹ {text}" for text in notes]] if notes else []),
        "",
        "Peak memory per device: " + "; ".join(text for kind, text in MEMORY_KINDS.items() if kind in kinds) + ".",
        "State per rank: the parameters, gradients and optimizer state one rank holds after the last step (the"
        " fullest rank; its shards under fsdp2 and tensor_parallel)"
        + (
            f"; 'over budget': more than the budget of {budget:g} MB (--memory-budget-mb), which counts this state"
            " only, not activations or the rest of the process."
            if budget is not None
            else "."
        ),
        "",
        *comparisons(table),
        *bubble_section(table),
        *startup_section(results.get("startup"), table),
    ]
    return "\n".join(lines) + "\n"


# -- files ---------------------------------------------------------------------------------------------------


def write_csv(path: Path, table: list[dict[str, Any]]) -> None:
    """One line per row, every figure of ``build_table`` a column (lists joined with ``|``)."""
    fields = list(dict.fromkeys(key for row in table for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in table:
            writer.writerow({k: ("|".join(map(str, v)) if isinstance(v, list) else v) for k, v in row.items()})


def write_all(out: Path, results: dict[str, Any], plots: bool = True) -> list[Path]:
    """Write ``results.json``, ``results.csv``, ``results.md`` and (with matplotlib) the two plots."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.csv", out / "results.md"]
    written[0].write_text(json.dumps(results, indent=1, default=str))
    write_csv(written[1], results["rows"])
    written[2].write_text(markdown(results))
    if plots:
        from benchmarks.plots import write_plots  # matplotlib: only where plots are drawn

        written += write_plots(results["rows"], out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description="Rewrite a benchmark's report.")
    parser.add_argument("out", type=Path, help="folder with results.json")
    args = parser.parse_args(argv)
    results = json.loads((args.out / "results.json").read_text())
    for path in write_all(args.out, results):
        print(path)


if __name__ == "__main__":
    main()
