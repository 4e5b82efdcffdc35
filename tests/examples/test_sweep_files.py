"""The first sweep shipped for the example model, configs/sweep/quick.yaml: it resolves to a fit config that runs on
the CPU (a project generated with the image example gets it; it searches that model's optimizer options)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.sweep import spec as sweep_spec
from multigpu.sweep.runner import dry_run
from tests.conftest import REPO

SWEEP_FILES = sorted((REPO / "configs" / "sweep").glob("*.yaml"))


def test_the_first_sweep_is_shipped():
    assert [p.name for p in SWEEP_FILES] == ["quick.yaml"]


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_shipped_sweep_files_resolve_to_fit_configs(path: Path, tmp_path: Path) -> None:
    spec = sweep_spec.load(path)
    config = dry_run(spec, tmp_path, [])  # the fit arguments and every searched key, as the CLI reads them
    for param in spec.space:  # the dry run sets each searched option to its first value
        value = config
        for part in param.key.split("."):
            value = value[part]
        assert value == (param.choices[0] if param.choices is not None else param.low), param.key
    assert config["trainer"]["accelerator"] == "cpu"  # a first sweep that runs anywhere
