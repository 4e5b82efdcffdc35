"""The image example and the GPT example, each proven as a project proves its own model, with the engine's helpers
(``multigpu/testing.py``, the ``project`` fixture): through ``python -m src.cli``, it trains, ddp on 2 processes
trains the one-device model (fp64), a run stopped by SIGTERM and resumed with dropout on is the uninterrupted run
bit for bit, and a bad option gets one paragraph. (What these proofs do not cover stays in test_image.py and the
GPT's files: the compiled forward under ddp, the sharded strategies, learning.)"""

from __future__ import annotations

import pytest

from tests.examples.conftest import TINY_GPT_MODEL, TINY_IMAGE

#: each example's settings, as a project's conftest.py gives them (the fixture ``project_args``), and an option
#: that example refuses, with the option its paragraph names
EXAMPLES = {
    "image": (TINY_IMAGE, "--data.init_args.synthetic_train_size=0"),
    "gpt": (
        # clipped: under ddp the norm must be the one of the whole batch's gradient
        [*TINY_GPT_MODEL, "--trainer.gradient_clip_val=0.5", "--trainer.accumulate_grad_batches=1"],
        "--data.init_args.block_size=64",  # longer than the model's block_size=32
    ),
}


@pytest.fixture(params=list(EXAMPLES))
def example(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def project_args(example: str) -> list[str]:
    return EXAMPLES[example][0]


def test_it_trains(project):
    project.assert_trains()


@pytest.mark.slow
def test_ddp_trains_the_one_device_model(project):
    project.assert_same_model_under_ddp()


@pytest.mark.slow
def test_a_stopped_run_resumes_exactly_with_dropout_on(project):
    project.assert_exact_resume("--model.init_args.dropout=0.1")


def test_a_bad_option_gets_one_paragraph(project, example):
    bad = EXAMPLES[example][1]
    project.assert_refuses(bad, option=bad)
