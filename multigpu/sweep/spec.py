"""The sweep file (docs/sweeps.md), checked whole when read, before any trial starts. Whether a ``space`` key is
an option of ``fit`` is left to the CLI's dry run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from multigpu.command import prog

SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "grid": "GridSampler"}
PRUNERS = {
    "none": "NopPruner",
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "threshold": "ThresholdPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "patient": "PatientPruner",
    "wilcoxon": "WilcoxonPruner",
}
KEYS = ("fit", "objective", "trials", "sampler", "pruner", "space", "name")
RANGE_KEYS = ("low", "high", "log", "step")
EXAMPLE_RANGE = "{low: 1.0e-4, high: 1.0e-1, log: true}"
EXAMPLE_CHOICES = "{choices: [64, 128, 256]}"


class SweepError(ValueError):
    """A mistake in the sweep file or the ``python -m multigpu.sweep`` command line."""

    exit_code = 2


@dataclass(frozen=True)
class Param:
    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        # without a step, {low: 0, high: 1} stays a float range: a dropout rate must not become 0 or 1
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high, self.step))

    def grid(self) -> list[Any] | None:
        """The values a grid walks through; None for a continuous range."""
        if self.choices is not None:
            return list(self.choices)
        if self.step is None or self.low is None or self.high is None:
            return None
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        values = [self.low + i * self.step for i in range(count)]
        return [int(v) for v in values] if self.is_int else values

    def suggest(self, trial: Any) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.key, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    fit: tuple[str, ...]
    metric: str
    mode: str
    trials: int
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    space: tuple[Param, ...]
    name: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def direction(self) -> str:
        return "minimize" if self.mode == "min" else "maximize"

    def grid_size(self) -> int | None:
        if self.sampler["name"] != "grid":
            return None
        return math.prod(len(p.grid() or []) for p in self.space)

    def build_sampler(self, trial_number: int = 0) -> Any:
        import optuna

        options = {k: v for k, v in self.sampler.items() if k != "name"}
        if options.get("seed") is not None and self.sampler["name"] != "grid":
            # seed + trial number: workers from one file never draw the same values, and a trial's values do not
            # depend on which worker drew them; a grid shuffles by its seed once, so its seed stays put
            options["seed"] = int(options["seed"]) + trial_number
        if self.sampler["name"] == "grid":
            options["search_space"] = {p.key: p.grid() for p in self.space}
        return _build(optuna.samplers, SAMPLERS[self.sampler["name"]], options, "sampler")

    def build_pruner(self) -> Any:
        import optuna

        options = {k: v for k, v in self.pruner.items() if k != "name"}
        return _build(optuna.pruners, PRUNERS[self.pruner["name"]], options, "pruner")

    def identity(self) -> dict[str, Any]:
        """What a sweep directory is bound to: everything but the number of trials, which may grow."""
        return {k: v for k, v in self.raw.items() if k != "trials"}


def _build(module: Any, class_name: str, options: dict[str, Any], section: str) -> Any:
    cls = getattr(module, class_name)
    try:
        return cls(**options)
    except (TypeError, ValueError) as error:
        raise SweepError(
            f"{section}: {class_name} does not accept {options} ({error}). Fix: use the options of"
            f" optuna.{module.__name__.split('.')[-1]}.{class_name}, or only `name`."
        ) from error


def load(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; raise ``SweepError`` naming the key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {path} does not exist. Fix: pass the path of a sweep file (configs/sweep/).")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise SweepError(f"{path} is not valid YAML: {' '.join(str(error).split())}. Fix: correct that line.") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> SweepSpec:
    where = str(path)
    if not isinstance(raw, dict):
        raise SweepError(
            f"{where}: a sweep file is a mapping of {', '.join(KEYS)}. Fix: see the engine's docs/sweeps.md."
        )
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise SweepError(
            f"{where}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], KEYS)}. Fix: use only"
            f" {', '.join(KEYS)}; options of the fit runs go in `fit` (arguments) or `space` (searched)."
        )
    for key in ("fit", "objective", "space"):
        if key not in raw:
            raise SweepError(f"{where}: `{key}` is missing. Fix: add it (configs/sweep/ has an example).")
    fit = raw["fit"]
    if isinstance(fit, str):
        fit = fit.split()
    if not isinstance(fit, list) or not all(isinstance(a, (str, int, float)) for a in fit):
        raise SweepError(
            f"{where}: `fit` must be a list of arguments of `{prog()} fit`. Fix: e.g."
            " fit: [--config, configs/default.yaml, --trainer.max_steps=2000]."
        )
    metric, mode = _objective(raw["objective"], where)
    trials = raw.get("trials", 20)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise SweepError(f"{where}: trials: {trials!r} is not a positive whole number. Fix: e.g. trials: 20.")
    sampler = _named(raw.get("sampler") or {"name": "tpe"}, "sampler", SAMPLERS, where)
    pruner = _named(raw.get("pruner") or {"name": "none"}, "pruner", PRUNERS, where)
    space = raw["space"]
    if not isinstance(space, dict) or not space:
        raise SweepError(
            f"{where}: `space` must map option names to ranges or choices. Fix: e.g."
            f" space: {{model.init_args.optimizer.init_args.lr: {EXAMPLE_RANGE}}}."
        )
    params = tuple(_param(str(key), entry, where) for key, entry in space.items())
    if sampler["name"] == "grid":
        continuous = [p.key for p in params if p.grid() is None]
        if continuous:
            raise SweepError(
                f"{where}: space: {continuous[0]} is a continuous range, which a grid cannot walk. Fix: give it"
                f" `choices`, or a `step`, or use sampler: {{name: tpe}}."
            )
    name = raw.get("name")
    if name is not None and not (isinstance(name, str) and name.strip()):
        raise SweepError(
            f"{where}: name: {name!r} is not a non-empty string. Fix: e.g. name: lr-sweep (the wandb group)."
        )
    spec = SweepSpec(
        path=path,
        fit=tuple(str(a) for a in fit),
        metric=metric,
        mode=mode,
        trials=trials,
        sampler=sampler,
        pruner=pruner,
        space=params,
        name=name,
        raw=raw,
    )
    spec.build_sampler()  # Optuna checks their options, before anything is written
    spec.build_pruner()
    return spec


def _objective(entry: Any, where: str) -> tuple[str, str]:
    fix = "Fix: e.g. objective: {metric: val/loss, mode: min}."
    if not isinstance(entry, dict):
        raise SweepError(f"{where}: `objective` must be a mapping. {fix}")
    unknown = [k for k in entry if k not in ("metric", "mode")]
    if unknown:
        raise SweepError(f"{where}: objective: unknown key {unknown[0]!r}. Only metric and mode exist. {fix}")
    metric, mode = entry.get("metric"), entry.get("mode", "min")
    if not isinstance(metric, str) or not metric:
        raise SweepError(f"{where}: objective: `metric` is missing (a metric the model logs at validation). {fix}")
    if mode not in ("min", "max"):
        raise SweepError(f"{where}: objective: mode: {mode!r} is neither min nor max. {fix}")
    return metric, mode


def _named(entry: Any, section: str, known: dict[str, str], where: str) -> dict[str, Any]:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or "name" not in entry:
        raise SweepError(f"{where}: `{section}` needs a name. Fix: e.g. {section}: {{name: {next(iter(known))}}}.")
    name = str(entry["name"]).lower()
    if name not in known:
        raise SweepError(
            f"{where}: {section}: unknown name {entry['name']!r}{_did_you_mean(name, known)}. Fix: use one of"
            f" {', '.join(known)}."
        )
    return {**entry, "name": name}


def _param(key: str, entry: Any, where: str) -> Param:
    at = f"{where}: space: {key}"
    if key.startswith("-"):
        raise SweepError(f"{at}: write the option without dashes. Fix: {key.lstrip('-')}: ...")
    if not isinstance(entry, dict):
        raise SweepError(f"{at} is {entry!r}. Fix: a range {EXAMPLE_RANGE} or a list {EXAMPLE_CHOICES}.")
    if "choices" in entry:
        extra = [k for k in entry if k != "choices"]
        choices = entry["choices"]
        if extra:
            raise SweepError(f"{at}: `choices` cannot be combined with {extra[0]!r}. Fix: {EXAMPLE_CHOICES}.")
        if not isinstance(choices, list) or not choices:
            raise SweepError(f"{at}: choices must be a non-empty list. Fix: e.g. {EXAMPLE_CHOICES}.")
        bad = [c for c in choices if c is not None and not isinstance(c, (bool, int, float, str))]
        if bad:
            raise SweepError(f"{at}: choice {bad[0]!r} is not a number, string, boolean or null. Fix: use only those.")
        return Param(key, choices=tuple(choices))
    unknown = [k for k in entry if k not in RANGE_KEYS]
    if unknown:
        raise SweepError(
            f"{at}: unknown key {unknown[0]!r}. Fix: a range takes {', '.join(RANGE_KEYS)}"
            f" ({EXAMPLE_RANGE}); a list takes only `choices` ({EXAMPLE_CHOICES})."
        )
    low, high, log, step = entry.get("low"), entry.get("high"), entry.get("log", False), entry.get("step")
    numbers = (low, high) if step is None else (low, high, step)
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in numbers):
        raise SweepError(f"{at}: low and high (and step) must be numbers. Fix: e.g. {EXAMPLE_RANGE}.")
    if not low < high:
        raise SweepError(f"{at}: low ({low}) must be below high ({high}). Fix: swap or correct them.")
    if not isinstance(log, bool):
        raise SweepError(f"{at}: log: {log!r} is not a boolean. Fix: log: true or log: false.")
    if log and low <= 0:
        raise SweepError(f"{at}: a log range needs low > 0 (got {low}). Fix: raise low, or set log: false.")
    if log and step is not None and not (step == 1 and all(isinstance(v, int) for v in (low, high, step))):
        raise SweepError(
            f"{at}: a log range takes no step but 1 for whole numbers (Optuna's rule). Fix: drop `step` or `log`."
        )
    if step is not None and step <= 0:
        raise SweepError(f"{at}: step must be positive (got {step}). Fix: e.g. step: 1.")
    return Param(key, low=low, high=high, log=log, step=step)


def _did_you_mean(word: str, known: Any) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def flag(key: str, value: Any) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    return f"--{key}={text}"
