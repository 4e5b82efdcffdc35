"""From per-step times to the benchmark's figures: one run, the median over repeats, and ratios between rows."""

from __future__ import annotations

import statistics
from typing import Any

#: the per-device figure of the template's memory probe (``multigpu.observe.throughput.peak_memory``), in the order
#: looked for: PyTorch's allocator peak on a GPU, the process's peak resident set on a CPU
MEMORY_FIGURES = ("perf/memory_allocated_gb", "perf/memory_rss_gb")


def device_memory(probe: dict[str, float]) -> tuple[str, float]:
    """(which figure, GB) of one process's peak memory, from what the probe returned."""
    kind = next(name for name in MEMORY_FIGURES if name in probe)
    return kind, probe[kind]


#: the model state a rank holds (``state_per_rank``)
STATE_FIELDS = ("state_mb_per_rank", "parameters_mb_per_rank", "gradients_mb_per_rank", "optimizer_state_mb_per_rank")


def state_per_rank(ranks: list[dict[str, Any]]) -> dict[str, float | None]:
    """MB (10^6 bytes) of parameters + gradients + optimizer state that the fullest rank holds after the last step,
    and its parts; None where the run did not count them (``multigpu.strategies.model_parallel.memory_per_rank``)."""
    counted = [r["state_bytes"] for r in ranks if r.get("state_bytes")]
    if not counted:
        return dict.fromkeys(STATE_FIELDS)
    fullest = max(counted, key=lambda parts: sum(parts.values()))
    return {
        "state_mb_per_rank": sum(fullest.values()) / 1e6,
        **{f"{part}_mb_per_rank": fullest[part] / 1e6 for part in ("parameters", "gradients", "optimizer_state")},
    }


def _quartiles(values: list[float]) -> list[float]:
    # linear interpolation between the closest ranks, as numpy's default
    return statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3


def idle_share(window_s: float, work_s: float) -> float:
    """The share of a step's pipelined part in which the stage did not work: it waited for its neighbours."""
    return 1 - work_s / window_s


def bubble_figures(ranks: list[dict[str, Any]], timed: list[bool]) -> dict[str, Any]:
    """The measured bubble of a pipeline run (``benchmarks.clock.StageClock``), over the steps marked ``timed``
    (aligned with ``step_times_s``): per step, the mean over the ranks of each one's idle share; the median of those
    and their quartiles, and each stage's median. Empty where the run was not pipelined."""
    if not ranks or "pipeline_window_s" not in ranks[0]:
        return {}
    shares: list[list[float]] = []  # per rank, per timed step
    for rank in ranks:
        steps = zip(rank["pipeline_window_s"], rank["pipeline_work_s"], timed, strict=True)
        shares.append([idle_share(window, work) for window, work, keep in steps if keep and window is not None])
    if not all(shares) or len({len(per_rank) for per_rank in shares}) != 1:
        return {}
    per_step = [statistics.fmean(step) for step in zip(*shares, strict=True)]
    quartiles = _quartiles(per_step)
    stages: dict[int, list[float]] = {}
    for rank, per_rank in zip(ranks, shares, strict=True):
        stages.setdefault(rank.get("pipeline_stage", 0), []).extend(per_rank)
    return {
        "bubble_measured": statistics.median(per_step),
        "bubble_p25": quartiles[0],
        "bubble_p75": quartiles[2],
        "bubble_per_stage": [statistics.median(stages[stage]) for stage in sorted(stages)],
    }


def summarise_run(ranks: list[dict[str, Any]], warmup: int, global_batch: int) -> dict[str, Any]:
    """Figures of one run from the JSON of each of its processes (rank 0 first).

    The timed window is every step after the first ``warmup``; a step that began a new pass over the data is
    left out as well (it carries the epoch-end hooks and the loader restart). Ranks wait for each other in the
    gradient all-reduce, so rank 0's step times stand for the run.
    """
    rank0 = ranks[0]
    times = rank0["step_times_s"][max(0, warmup - 1) :]
    new_epoch = rank0["new_epoch"][max(0, warmup - 1) :]
    steady = [t for t, boundary in zip(times, new_epoch, strict=True) if not boundary]
    cpu = [t for t, boundary in zip(rank0["cpu_times_s"][max(0, warmup - 1) :], new_epoch, strict=True) if not boundary]
    if not steady:
        raise ValueError(f"no timed steps after {warmup} warm-up steps ({rank0['steps']} steps recorded)")
    mean = statistics.fmean(steady)
    quartiles = _quartiles(steady)
    startups = [r["first_step_s"] for r in ranks if r.get("first_step_s") is not None]
    memory = [device_memory(r["peak_memory"]) for r in ranks]
    timed = [i >= max(0, warmup - 1) and not boundary for i, boundary in enumerate(rank0["new_epoch"])]
    return {
        "timed_steps": len(steady),
        "epoch_boundaries_excluded": len(times) - len(steady),
        "step_ms_median": 1000 * statistics.median(steady),
        "step_ms_p25": 1000 * quartiles[0],
        "step_ms_p75": 1000 * quartiles[2],
        "step_ms_mean": 1000 * mean,
        "samples_per_s": global_batch / mean,
        "cpu_ms_mean": 1000 * statistics.fmean(cpu),
        # below ~0.9 on a CPU the process waited: for other processes on its core, or for its peers' gradients
        "cpu_share": statistics.fmean(cpu) / mean,
        "startup_s": max(startups) if startups else None,
        "peak_memory_mb": 1000 * max(gb for _, gb in memory),
        "memory_kind": memory[0][0],
        **state_per_rank(ranks),
        "threads_per_process": sorted({r["threads"] for r in ranks}),
        "processes": len(ranks),
        "device": rank0["device"],
        "strategy_class": rank0.get("strategy"),
        "precision_run": rank0.get("precision"),
        "loss_first": rank0.get("losses", {}).get("first"),
        "loss_last": rank0.get("losses", {}).get("last"),
        **bubble_figures(ranks, timed),  # pipeline runs only
    }


#: figures that are combined over repeats by their median
MEDIAN_FIELDS = (
    "step_ms_median",
    "step_ms_p25",
    "step_ms_p75",
    "step_ms_mean",
    "cpu_ms_mean",
    "cpu_share",
    "samples_per_s",
    "startup_s",
    "bubble_measured",
    "bubble_p25",
    "bubble_p75",
)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the successful repeats of one row; the spread of throughput beside it."""
    if runs and all("not_applicable" in run for run in runs):
        return {"repeats_ok": 0, "repeats": 0, "not_applicable": runs[0]["not_applicable"]}
    ok = [run for run in runs if "error" not in run]
    if not ok:
        return {"repeats_ok": 0, "error": runs[-1].get("error", "failed") if runs else "not run"}
    result: dict[str, Any] = {"repeats_ok": len(ok), "repeats": len(runs)}
    for name in MEDIAN_FIELDS:
        values = [run[name] for run in ok if run.get(name) is not None]
        result[name] = statistics.median(values) if values else None
    throughputs = [run["samples_per_s"] for run in ok]
    result["samples_per_s_min"] = min(throughputs)
    result["samples_per_s_max"] = max(throughputs)
    result["peak_memory_mb"] = max(run["peak_memory_mb"] for run in ok)
    bubbles = [run for run in ok if run.get("bubble_measured") is not None]
    if bubbles:  # a pipeline row: the spread over repeats, and each stage's median
        result["bubble_measured_min"] = min(run["bubble_measured"] for run in bubbles)
        result["bubble_measured_max"] = max(run["bubble_measured"] for run in bubbles)
        per_stage = zip(*(run["bubble_per_stage"] for run in bubbles), strict=True)
        result["bubble_per_stage"] = [statistics.median(stage) for stage in per_stage]
    for name in STATE_FIELDS:  # the same in every repeat: what the model and optimizer hold, not a timing
        result[name] = ok[0].get(name)
    for name in ("memory_kind", "threads_per_process", "processes", "device", "strategy_class", "precision_run"):
        result[name] = ok[0][name]
    result["loss_first"] = ok[0]["loss_first"]
    result["loss_last"] = ok[0]["loss_last"]
    if len(ok) < len(runs):
        result["error"] = f"{len(runs) - len(ok)} of {len(runs)} repeats failed"
    return result


def scaling_efficiency(throughput: float | None, devices: int, reference: float | None) -> float | None:
    """Throughput over ``devices`` times the single-device throughput (1.0 is linear scaling)."""
    if not throughput or not reference:
        return None
    return throughput / (devices * reference)


def overhead(template: dict[str, Any], plain: dict[str, Any]) -> dict[str, float] | None:
    """Extra time per optimizer step of a template row over its plain PyTorch counterpart."""
    if template.get("step_ms_mean") is None or plain.get("step_ms_mean") is None:
        return None
    mean = template["step_ms_mean"] - plain["step_ms_mean"]
    median = template["step_ms_median"] - plain["step_ms_median"]
    return {
        "ms_per_step": mean,
        "percent": 100 * mean / plain["step_ms_mean"],
        "median_ms_per_step": median,
        "median_percent": 100 * median / plain["step_ms_median"],
        "throughput_ratio": template["samples_per_s"] / plain["samples_per_s"],
        # main-thread CPU time: the robust estimate of the extra work where other jobs share the cores
        "cpu_ms_per_step": template["cpu_ms_mean"] - plain["cpu_ms_mean"],
    }
