"""The run directory (multigpu/run/run_dir.py): loggers write into it, one wandb run per directory, and the seed every
process
of one job shares."""

from __future__ import annotations

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

from multigpu.run.run_dir import WANDB_ID_FILE, place_loggers, shared_random_seed, stable_wandb_id

WANDB = "lightning.pytorch.loggers.WandbLogger"


def test_a_run_directory_keeps_the_wandb_id_rank_0_wrote(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    run_dir = tmp_path / "run"
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    stable_wandb_id(str(run_dir))
    assert not (run_dir / WANDB_ID_FILE).exists()  # only rank 0 writes it
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    first = stable_wandb_id(str(run_dir))
    assert (run_dir / WANDB_ID_FILE).read_text() == f"{first}\n" and len(first) == 12
    monkeypatch.setenv("WANDB_RUN_ID", "abc123")
    assert stable_wandb_id(str(run_dir)) == first  # a restart continues the directory's run
    assert stable_wandb_id(str(tmp_path / "other")) == "abc123"  # a new directory takes wandb's own variable


def test_loggers_without_a_save_dir_write_into_the_run_directory_and_wandb_continues_its_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    run_dir = str(tmp_path / "run")
    csv = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir="."))
    tensorboard = Namespace(
        class_path="lightning.pytorch.loggers.TensorBoardLogger", init_args=Namespace(save_dir="/elsewhere")
    )
    wandb = Namespace(class_path=WANDB)  # no init_args at all
    named = Namespace(class_path=WANDB, init_args=Namespace(save_dir=None, id="mine"))
    place_loggers(Namespace(default_root_dir=run_dir, logger=[csv, tensorboard, wandb, named]), run_dir)
    assert csv.init_args.save_dir == wandb.init_args.save_dir == named.init_args.save_dir == run_dir
    assert tensorboard.init_args.save_dir == "/elsewhere"  # a folder of the user's stands
    assert wandb.init_args.id == (tmp_path / "run" / WANDB_ID_FILE).read_text().strip()
    assert named.init_args.id == "mine"
    one = Namespace(class_path=WANDB)
    place_loggers(Namespace(default_root_dir=run_dir, logger=one), run_dir)  # one logger, not a list
    assert one.init_args.id == wandb.init_args.id  # the directory's one wandb run
    place_loggers(Namespace(default_root_dir=run_dir, logger=False), run_dir)  # no logger: nothing to place


def test_random_seed_is_shared_by_the_processes_of_one_job(monkeypatch):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    first = shared_random_seed()
    assert shared_random_seed() == first  # every rank of the job, and the job requeued
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert shared_random_seed() != first  # another job, another seed
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # processes Lightning started inherit the first one's
    assert shared_random_seed() == 7
