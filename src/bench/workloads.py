"""The benchmark's workloads: one definition read by both the template's CLI and the plain PyTorch baselines.

A workload is the template's own YAML configs plus a few overrides. The template rows pass the same files and
overrides to ``python -m src.cli fit``; the baselines merge the same YAML here, so both train the same network,
with the same initialisation, optimizer, scheduler, gradient clipping and data.
"""

from __future__ import annotations

import copy
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "default.yaml"


@dataclass(frozen=True)
class Workload:
    """A named training job: config files (after ``configs/default.yaml``) and dotted-key overrides."""

    name: str
    description: str
    configs: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    quick_overrides: dict[str, Any] = field(default_factory=dict)

    def settings(self, quick: bool) -> dict[str, Any]:
        return {**self.overrides, **(self.quick_overrides if quick else {})}


WORKLOADS: dict[str, Workload] = {
    "image": Workload(
        name="image",
        description="ImageClassifier (CompactResNet, GroupNorm) on the synthetic 32x32 set, AdamW",
        quick_overrides={
            "model.init_args.widths": [8, 16],
            "data.init_args.synthetic_train_size": 2048,
            "data.init_args.synthetic_val_size": 64,
            "data.init_args.batch_size": 32,
        },
    ),
    "gpt": Workload(
        name="gpt",
        description="CausalLanguageModel (byte-level GPT) on the embedded corpus, AdamW + cosine, clip 1.0",
        configs=("configs/experiment/gpt.yaml",),
        quick_overrides={
            "model.init_args.n_layer": 2,
            "model.init_args.n_head": 2,
            "model.init_args.n_embd": 32,
            "model.init_args.block_size": 32,
            "data.init_args.block_size": 32,
            "data.init_args.corpus_chars": 40000,
            "data.init_args.batch_size": 16,
        },
    ),
}


def cli_flags(workload: Workload, quick: bool, extra: dict[str, Any] | None = None) -> list[str]:
    """``--config`` and ``--key=value`` arguments that make ``python -m src.cli fit`` train this workload."""
    flags = [f"--config={REPO / name}" for name in workload.configs]
    for key, value in {**workload.settings(quick), **(extra or {})}.items():
        text = value if isinstance(value, str) else json.dumps(value)
        flags.append(f"--{key}={text}")
    return flags


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            # another class replaces the old arguments (as for the model and data of configs/experiment/gpt.yaml)
            replaced = "class_path" in value and value["class_path"] != old.get("class_path")
            merged[key] = copy.deepcopy(value) if replaced else _merge(old, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve(workload: Workload, quick: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The merged configuration (YAML files, then overrides) as the baselines read it."""
    config: dict[str, Any] = {}
    for path in (DEFAULT_CONFIG, *(REPO / name for name in workload.configs)):
        config = _merge(config, yaml.safe_load(path.read_text()) or {})
    for key, value in {**workload.settings(quick), **(extra or {})}.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return config


def import_class(class_path: str) -> Any:
    module_name, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def build_model(config: dict[str, Any]) -> Any:
    """The workload's LightningModule, built as the CLI builds it (without the optimizer factories)."""
    section = config["model"]
    init_args = {k: v for k, v in section.get("init_args", {}).items() if k not in ("optimizer", "lr_scheduler")}
    return import_class(section["class_path"])(**init_args)


def build_datamodule(config: dict[str, Any]) -> Any:
    section = config["data"]
    return import_class(section["class_path"])(**section.get("init_args", {}))


def build_optimizer(config: dict[str, Any], parameters: Any) -> tuple[Any, Any]:
    """(optimizer, scheduler or None) from ``model.init_args.optimizer`` / ``lr_scheduler``."""
    init_args = config["model"].get("init_args", {})
    spec = init_args.get("optimizer") or {"class_path": "torch.optim.AdamW"}
    optimizer = import_class(spec["class_path"])(parameters, **spec.get("init_args", {}))
    spec = init_args.get("lr_scheduler")
    scheduler = import_class(spec["class_path"])(optimizer, **spec.get("init_args", {})) if spec else None
    return optimizer, scheduler


def global_batch_size(config: dict[str, Any]) -> int:
    return int(config["data"]["init_args"]["batch_size"])


def tokens_per_sample(config: dict[str, Any]) -> int | None:
    """Tokens per sequence for the language model; None for other workloads."""
    block_size = config["data"].get("init_args", {}).get("block_size")
    return int(block_size) if "TextDataModule" in config["data"]["class_path"] and block_size else None
