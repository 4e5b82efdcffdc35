"""Evaluation covers the same samples at any world size, and spawned workers keep their metric states apart.

``limit_val_batches=k`` / ``limit_test_batches=k`` mean the first ``k`` global batches of the set in order, on one
process as under ``ddp``; every sample is counted once and every rank runs as many batches. Under ``ddp_spawn``
each worker has its own metric states (they arrive in shared memory; the copying is tested in
tests/faults/test_ranks.py), so the first validation after a resume is the one an uninterrupted run logs
(``tests/faults/test_preemption.py``) and ``validate`` equals the single-device result (here, on this module's
checkpoint). Under ``ddp`` one launch per stage: ``validate`` on its first 2 batches, ``test`` on the whole set
(the limit and the short last batch go through the same sampler for either stage); one process checks all four
against the numbers computed by hand.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from multigpu.data.sampling import EvaluationBatches, global_evaluation_batches
from tests.cli import main
from tests.conftest import TINY, read_metrics
from tests.fixtures.workload import TinyClassifier, TinyData

#: the checkpoint fixture is shared by the evaluations: one worker trains it once
pytestmark = pytest.mark.xdist_group("test_evaluation_order")

# -- the sampler ---------------------------------------------------------------------------------------------------

SIZES = [1, 2, 3, 5, 7, 10, 31, 32, 33, 34, 35, 64, 97, 101, 128]
BATCHES = [4, 12, 32]


def rank_batches(size: int, batch: int, world: int) -> list[list[list[int]]]:
    return [list(EvaluationBatches(range(size), batch, world, rank)) for rank in range(world)]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("size", SIZES)
def test_global_batch_k_is_the_same_samples_at_every_world_size(size, world, batch):
    single = [b for (b,) in zip(*rank_batches(size, batch, 1), strict=True)]
    assert single == [list(range(k * batch, min((k + 1) * batch, size))) for k in range(-(-size // batch))]
    ranks = rank_batches(size, batch, world)
    assert len({len(r) for r in ranks}) == 1  # as many batches on every rank: per-step collectives cannot hang
    joined = [[i for share in shares for i in share] for shares in zip(*ranks, strict=True)]
    if size < world:  # the one case that repeats samples: a set smaller than the world
        assert joined == [[i % size for i in range(world)]]
        return
    merged = len(joined) < len(single)  # a short last batch (fewer samples than processes) joined the previous one
    assert merged == (len(single) > 1 and size % batch != 0 and size % batch < world)
    assert joined[: len(single) - 2 if merged else None] == single[: len(single) - 2 if merged else None]
    if merged:
        assert joined[-1] == single[-2] + single[-1]
    assert [i for b in joined for i in b] == list(range(size))  # every sample exactly once, in order
    for shares in zip(*ranks, strict=True):
        sizes = [len(s) for s in shares]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_limit_batches_take_the_same_samples_on_one_and_on_two_processes():
    """The example a person meets: 128 samples, global batch 32, ``limit_val_batches=2``."""
    one = rank_batches(128, 32, 1)[0][:2]
    two = rank_batches(128, 32, 2)
    assert [i for b in one for i in b] == list(range(64))
    assert sorted(i for r in two for b in r[:2] for i in b) == list(range(64))
    assert two[0][0] == list(range(16)) and two[1][0] == list(range(16, 32))


def test_short_last_batch_joins_the_previous_one():
    assert global_evaluation_batches(65, 32, world_size=2) == [range(0, 32), range(32, 65)]
    assert global_evaluation_batches(66, 32, world_size=2) == [range(0, 32), range(32, 64), range(64, 66)]
    assert global_evaluation_batches(65, 32, world_size=1) == [range(0, 32), range(32, 64), range(64, 65)]
    assert global_evaluation_batches(0, 32, world_size=2) == []
    assert rank_batches(0, 4, 2) == [[], []]


def test_batch_smaller_than_the_world_names_the_option_and_a_fix():
    with pytest.raises(ValueError, match=r"--data.batch_size=2 .*Fix: set --data.batch_size to at least 4"):
        EvaluationBatches(range(10), 2, num_replicas=4, rank=0)


# -- validate and test on one process and under ddp / ddp_spawn: the same numbers --------------------------------


class CountedSamples(L.Callback):
    """Logs ``<stage>/samples``: the samples the loss metric holds, summed over the ranks (before ``compute``)."""

    def _log(self, pl_module: L.LightningModule, stage: str) -> None:
        weight = getattr(pl_module, f"{stage}_loss").weight
        pl_module.log(f"{stage}/samples", weight.clone(), sync_dist=True, reduce_fx="sum")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(pl_module, "test")


COUNTED = ["--progress_bar=none", "--trainer.callbacks+=tests.data.test_evaluation_order.CountedSamples"]
FP64 = ["--trainer.precision=64-true", *COUNTED]
#: sizes that do not divide by the global batch of 32 or by 2 processes: unequal slices in the last batch
SETS = ["--data.init_args.val_size=101", "--data.init_args.test_size=99"]
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2"]
DDP_SPAWN = ["--trainer.strategy=ddp_spawn", "--trainer.devices=2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("fit")
    main(["fit", *TINY, *FP64, *SETS, "--trainer.max_steps=10", f"--trainer.default_root_dir={run_dir}"])
    return run_dir / "checkpoints" / "last.ckpt"


def evaluated(run_dir: Path, stage: str) -> dict[str, float]:
    (row,) = [r for r in read_metrics(run_dir) if r.get(f"{stage}/loss")]
    return {key: float(row[f"{stage}/{key}"]) for key in ("loss", "acc", "samples")}


#: the (stage, limit) pairs also evaluated under ddp
UNDER_DDP = {("validate", "2"), ("test", "1.0")}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["validate", "test"])
@pytest.mark.parametrize("limit", ["2", "1.0"], ids=["first-2-batches", "whole-set"])
def test_evaluation_gives_the_same_numbers_on_one_process_and_under_ddp(stage, limit, checkpoint, tmp_path, run_cli):
    name = "val" if stage == "validate" else "test"
    args = [*TINY, *FP64, *SETS, f"--ckpt_path={checkpoint}", f"--trainer.limit_{name}_batches={limit}"]
    main([stage, *args, f"--trainer.default_root_dir={tmp_path / 'one'}"])
    one = evaluated(tmp_path / "one", name)
    assert one == pytest.approx(by_hand(checkpoint, name, 64 if limit == "2" else None), rel=1e-12, abs=0)
    if (stage, limit) in UNDER_DDP:
        run_cli(stage, *args, *DDP, f"--trainer.default_root_dir={tmp_path / 'ddp'}")
        assert evaluated(tmp_path / "ddp", name) == pytest.approx(one, rel=1e-12, abs=0)


def by_hand(checkpoint: Path, name: str, samples: int | None) -> dict[str, float]:
    """Loss and accuracy of the checkpoint's weights on the set's first ``samples`` samples, in one fp64 batch."""
    data = TinyData(val_size=101, test_size=99)
    data.setup()
    features, labels = (data.val_set if name == "val" else data.test_set)[:samples]
    model = TinyClassifier().double()
    model.load_state_dict(torch.load(checkpoint, weights_only=False)["state_dict"])
    with torch.no_grad():
        logits = model(features)
    loss = F.cross_entropy(logits, labels)
    correct = (logits.argmax(1) == labels).sum()
    # torchmetrics divides its integer counts in float32 (the correctly rounded ratio); the loss mean is float64
    return {"loss": loss.item(), "acc": (correct.float() / len(labels)).item(), "samples": float(len(labels))}


@pytest.mark.slow
def test_validate_under_ddp_spawn_counts_each_sample_once(checkpoint, tmp_path, run_cli):
    """In fp32 (fp64 metric states are new tensors made in each worker, which hides it): before each worker had
    its own metric states, both added into the same ones, each rank's loss metric held all 64 samples and their
    sum over the ranks was 128."""
    args = [*TINY, *COUNTED, *SETS, f"--ckpt_path={checkpoint}", "--trainer.limit_val_batches=2"]
    main(["validate", *args, f"--trainer.default_root_dir={tmp_path / 'one'}"])
    run_cli("validate", *args, *DDP_SPAWN, f"--trainer.default_root_dir={tmp_path / 'spawn'}")
    one, spawn = evaluated(tmp_path / "one", "val"), evaluated(tmp_path / "spawn", "val")
    assert spawn["samples"] == one["samples"] == 64
    assert spawn["acc"] == one["acc"]
    assert spawn["loss"] == pytest.approx(one["loss"], rel=1e-6)  # float32 sums, in another order
