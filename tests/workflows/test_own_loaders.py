"""Data loaders the template did not write (``tests/zoo/loaders.py``: a GAN on a ``TensorDataset`` with
``DataLoader(shuffle=True)`` and manual optimization, a stream that does not shard itself, cropped text with two
persistent workers) get the engine's promises, proven as a user's project proves its model: the four proofs of
``multigpu.testing``, through the command line, each workload's batch meaning the global batch at any device count.
"""

from __future__ import annotations

import pytest

WORKLOADS = {
    "gan": ["--model=tests.zoo.loaders.DropoutGAN", "--data=tests.zoo.loaders.RingTensors"],
    "stream": ["--model=tests.zoo.loaders.StreamRegressor", "--data=tests.zoo.loaders.LineStream"],
    "text": ["--model=tests.zoo.loaders.DropoutClassifier", "--data=tests.zoo.loaders.CroppedText"],
}


@pytest.fixture(params=list(WORKLOADS))
def project_args(request: pytest.FixtureRequest) -> list[str]:
    return WORKLOADS[request.param]


def test_it_trains_and_the_plan_says_the_batch_is_global(project):
    run = project.assert_trains()
    assert run.plan()["batch_size_means"] == "global batch of one optimizer step"
    assert run.plan()["global_batch"] == 8


@pytest.mark.slow
def test_ddp_trains_the_one_device_model(project):
    project.assert_same_model_under_ddp("--model.init_args.dropout=0")


@pytest.mark.slow
def test_a_stopped_run_resumes_exactly(project):
    project.assert_exact_resume("--model.init_args.dropout=0.1")


def test_a_batch_size_of_zero_gets_one_paragraph(project):
    paragraph = project.assert_refuses("--data.init_args.batch_size=0", option="--data.batch_size")
    assert "train_dataloader() made a loader that torch refused: batch_size should be a positive integer" in paragraph
