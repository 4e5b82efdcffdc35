"""The profiler presets (configs/debug/profiler*.yaml) write their reports into the run directory."""

from __future__ import annotations

import json

import pytest

from tests.cli import main
from tests.conftest import TINY

SHORT = ["--trainer.limit_train_batches=6", "--trainer.limit_val_batches=1", "--progress_bar=none"]


@pytest.mark.parametrize(
    ("preset", "in_report"),
    [("profiler_simple", "run_training_batch"), ("profiler_advanced", "function calls")],
)
def test_lightning_profiler_preset_writes_its_report_into_the_run_directory(preset, in_report, tmp_path):
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            *TINY,
            "--config",
            f"configs/debug/{preset}.yaml",
            *SHORT,
            f"--trainer.default_root_dir={run_dir}",
        ]
    )
    report = run_dir / "logs" / "version_0" / "fit-profile.txt"
    assert in_report in report.read_text()


def test_pytorch_profiler_trace_holds_the_training_steps_in_chrome_trace_format(tmp_path):
    run_dir = tmp_path / "run"
    main(["fit", *TINY, "--config", "configs/debug/profiler.yaml", *SHORT, f"--trainer.default_root_dir={run_dir}"])
    log_dir = run_dir / "logs" / "version_0"
    assert "aten::" in (log_dir / "fit-profile.txt").read_text()  # the operator table
    (trace,) = log_dir.glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]  # what chrome://tracing and Perfetto open
    names = {event.get("name", "") for event in events}
    assert any(name.endswith("training_step") for name in names) and any(n.startswith("aten::") for n in names)
