"""The proofs a project's tests make (``multigpu/testing.py``): each passes on the tests' workload through the
command line, and fails, saying what differed, on a workload that breaks its claim (tests/fixtures/mistakes.py);
the plugin's fixtures, and the comparisons the proofs make.

The ``project`` fixture here is the suite's (tests/conftest.py: commands forked from the prewarmed server); the
plugin's own is run in a pytest of its own (``pytester``)."""

from __future__ import annotations

import math
import pickle
import signal
import subprocess
import sys

import pytest
import torch

import multigpu.testing
from multigpu.testing import STEPS, differences, key_differences, relative_difference
from tests.conftest import cli_env

pytest_plugins = ["pytester"]

#: the tests' workload with dropout on: the resume proof then covers the random state
TINY_WITH_DROPOUT = ["--config", "tests/configs/tiny.yaml", "--model.init_args.dropout=0.2"]
NO_DROPOUT = "--model.init_args.dropout=0"


@pytest.fixture
def project_args() -> list[str]:
    return TINY_WITH_DROPOUT


# -- the proofs on the tests' workload, and on mistakes ------------------------------------------------------------


def test_assert_trains_passes_and_returns_the_run(project):
    run = project.assert_trains()
    assert [row["step"] for row in run.metrics() if row.get("train/loss")] == [str(s) for s in range(STEPS)]
    assert run.checkpoint()["global_step"] == STEPS


def test_assert_trains_fails_on_a_crash_and_on_a_loss_that_is_not_finite(project):
    with pytest.raises(AssertionError, match=r"(?s)the run failed.*crashed at step 1"):
        project.assert_trains("--trainer.callbacks+=tests.helpers.CrashAtStep", "--trainer.callbacks.step=1")
    # a learning rate that overflows the weights, without the guard that stops a run at its first non-finite loss
    with pytest.raises(AssertionError, match=r"the training loss is not finite: \['train/loss=inf at step 1"):
        project.assert_trains("--model.init_args.optimizer.init_args.lr=1e37", "--callbacks_off=[nan_guard]")


@pytest.mark.slow
def test_assert_same_model_under_ddp_passes(project):
    project.assert_same_model_under_ddp(NO_DROPOUT)


def test_assert_same_model_under_ddp_fails_on_a_batch_per_process_before_running_ddp(project):
    """The reason, in one sentence from the one-device run's plan, not a weight difference: no ddp run is made."""
    data = ("--data=tests.fixtures.mistakes.PerProcessBatchData", "--batch_size_per_process=true")
    with pytest.raises(AssertionError) as failed:
        project.assert_same_model_under_ddp(NO_DROPOUT, *data)
    assert str(failed.value).startswith(
        "ddp on 2 processes cannot train the one-device model: the training loader of"
        " tests.fixtures.mistakes.PerProcessBatchData has a batch_size per process (--batch_size_per_process=true),"
        " so a step on 2 processes trains on 2 times the samples. (one device: "
    )
    assert not list(project.tmp_path.glob("ddp*"))


def test_the_ddp_proofs_reason_names_the_loader_whose_order_depends_on_the_processes():
    from multigpu.observe.run_plan import SAME_ORDER

    litdata = "depends on the number of processes: LitData stripes its samples among the processes"
    plan = {
        "data": "project.Data",
        "batch_size_means": ["loader 0: global batch of one optimizer step", "loader 1: per process (the loader...)"],
        "data_order": [f"loader 0: {SAME_ORDER}", f"loader 1: {litdata}"],
    }
    assert multigpu.testing.order_cause(plan, 2) == (
        f"ddp on 2 processes cannot train the one-device model: the training loader 1 of project.Data has an order"
        f" that {litdata}."
    )
    same = {"data": "project.Data", "batch_size_means": "global batch of one optimizer step", "data_order": SAME_ORDER}
    assert multigpu.testing.order_cause(same, 2) is None
    assert multigpu.testing.order_cause({}, 2) is None  # no plan written: the weights decide


@pytest.mark.slow
def test_assert_exact_resume_passes_with_dropout_on(project):
    project.assert_exact_resume()


@pytest.mark.slow
def test_assert_exact_resume_fails_when_a_generator_is_not_saved(project):
    with pytest.raises(AssertionError, match=r"resumed ended with another state.*\['state_dict'\]\['net\.") as failed:
        project.assert_exact_resume(NO_DROPOUT, "--model=tests.fixtures.mistakes.UnsavedNoiseClassifier")
    assert "['optimizer_states'][0]" in str(failed.value)


@pytest.mark.slow
def test_assert_exact_resume_names_a_loader_that_restarts_its_epoch(project):
    with pytest.raises(AssertionError, match=r"The resumed run said: note: the training loader of OwnBatchSamplerData"):
        project.assert_exact_resume("--data=tests.fixtures.mistakes.OwnBatchSamplerData")


def test_assert_refuses_returns_the_paragraph(project):
    paragraph = project.assert_refuses("--data.init_args.train_size=0", option="--data.init_args.train_size")
    assert paragraph.startswith("error: --data.init_args.train_size=0 leaves the train set empty. Fix:")


def test_assert_refuses_fails_on_an_accepted_option_a_crash_and_a_paragraph_naming_another_option(project):
    with pytest.raises(AssertionError, match="expected exit status 2"):
        project.assert_refuses("--trainer.max_steps=1", option="--trainer.max_steps")
    crash = r"RuntimeError: (addmm: )?mat1 and mat2 shapes"  # torch >= 2.15 names the operation first
    with pytest.raises(AssertionError, match=rf"(?s)expected exit status 2.*exit status 1.*{crash}"):
        project.assert_refuses("--data.init_args.in_features=8", option="--data.init_args.in_features")
    with pytest.raises(AssertionError, match=r"does not name --data\.init_args\.val_size"):
        project.assert_refuses("--data.init_args.train_size=0", option="--data.init_args.val_size")


# -- the plugin ------------------------------------------------------------------------------------------------


def test_the_plugin_gives_a_project_fixture_from_the_rootdir_with_its_project_args(pytester):
    """A project's conftest.py overrides ``project_args``; the ``project`` fixture runs from pytest's rootdir."""
    pytester.makeini("[pytest]\n")
    pytester.makeconftest("import pytest\n@pytest.fixture\ndef project_args():\n    return ['--trainer.max_steps=2']\n")
    pytester.makepyfile(
        test_it="""
        def test_project(project, request, tmp_path):
            assert project.root == request.config.rootpath
            assert project.args == ["--trainer.max_steps=2"] and project.cli == "src.cli"
            assert project.run_dir("run").parent == tmp_path
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_imports_neither_torch_nor_lightning():
    """pytest imports the plugin at every start, in every environment with the engine installed."""
    probe = "import sys, multigpu.testing; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_stopping_callback_is_a_lightning_callback_built_when_first_named():
    from lightning.pytorch.callbacks import Callback

    from multigpu.testing import SignalAtStep

    assert issubclass(SignalAtStep, Callback) and SignalAtStep is multigpu.testing.SignalAtStep
    assert (SignalAtStep.__module__, SignalAtStep.__qualname__) == ("multigpu.testing", "SignalAtStep")
    assert pickle.loads(pickle.dumps(SignalAtStep(step=2))).signal_number == signal.SIGUSR1  # ddp_spawn pickles it
    with pytest.raises(AttributeError, match="NoSuchThing"):
        multigpu.testing.NoSuchThing  # noqa: B018


# -- the comparisons -------------------------------------------------------------------------------------------


def test_relative_difference_counts_a_non_finite_entry_only_where_it_differs():
    a = {"w": torch.tensor([3.0, 4.0]), "best": torch.tensor(-math.inf), "steps": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 4.5]), "best": torch.tensor(-math.inf), "steps": torch.tensor(4)}
    assert relative_difference(a, b) == pytest.approx(0.1)  # ||(0, 0.5)|| / ||(3, 4)||; integers not compared
    assert relative_difference(a, a) == 0.0
    assert relative_difference(a, {**b, "best": torch.tensor(0.5)}) == math.inf
    assert key_differences(a, b) == {"w": pytest.approx(0.1), "best": 0.0}
    with pytest.raises(AssertionError, match=r"only in one, \['extra'\]"):
        relative_difference(a, {**b, "extra": torch.zeros(1)})


def test_differences_name_each_place_largest_first_and_take_nan_as_equal():
    a = {"state": {0: {"m": torch.tensor([1.0, math.nan])}, 1: {"m": torch.tensor([1.0])}}, "step": 4, "lr": [0.1]}
    b = {"state": {0: {"m": torch.tensor([1.5, math.nan])}, 1: {"m": torch.tensor([3.0])}}, "step": 5, "lr": [0.1]}
    assert differences(a, a) == []
    assert differences(a, b) == [
        "['step']: 4 against 5",
        "['state'][1]['m']: largest difference 2",
        "['state'][0]['m']: largest difference 0.5",
    ]
    assert differences({"m": torch.tensor([1.0])}, {"m": torch.tensor([1.0 + 1e-13])}, tolerance=1e-12) == []
