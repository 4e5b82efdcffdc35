"""The baselines: a plain PyTorch loop, plain PyTorch DDP (``torch.multiprocessing.spawn``) and bare Lightning.

``python -m benchmarks.plain --workload image --mode ddp --devices 2 --batch-size 32 --steps 20 --out run.json``
builds the workload through the template's CLI (``CLI(run=False)``: the same model class, seed, data
module, optimizer, LR scheduler and gradient clipping as ``python -m src.cli fit``) and trains its ``model.net``
on the same data: the same global batch order (``GlobalBatchSampler``), per-process batch, augmentation,
normalisation and precision. ``--mode loop`` runs one process without DDP; ``--mode ddp`` spawns ``--devices``
processes that wrap the network in ``DistributedDataParallel`` (gloo on CPU, NCCL on GPU), as in the article this
template grew from. What both leave out is Lightning and the template. ``--mode lightning`` is the third
baseline, bare Lightning (``benchmarks/bare.py``): Lightning's loop without the template.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from benchmarks.clock import StepClock
from benchmarks.workloads import WORKLOADS, add_workload_arguments, build_cli, optimizer_and_scheduler

# the CLI, src.data and src.models import Lightning: only the training processes import them, so the launcher of
# plain DDP starts as fast as a plain PyTorch script does.

#: autocast dtype of each mixed precision; on a CPU Lightning runs 16-mixed as bf16-mixed, and so does this
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def batches(loader: DataLoader, sampler: Any) -> Iterator[tuple[int, bool, Any]]:
    """(epoch, first batch of the epoch, batch) forever; each epoch reshuffles as the template's sampler does."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            yield epoch, index == 0, batch
        epoch += 1


def image_step(seed: int, device: torch.device) -> Callable[[Any, int], tuple[Tensor, Tensor]]:
    """Transfer, augment and normalise as ``CIFAR10DataModule.on_after_batch_transfer`` does."""
    from src.data.images import CIFAR10_MEAN, CIFAR10_STD, random_crop_flip

    mean = torch.tensor(CIFAR10_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=device).view(1, 3, 1, 1)

    def prepare(batch: Any, epoch: int) -> tuple[Tensor, Tensor]:
        images, labels, indices = (t.to(device, non_blocking=True) for t in batch)
        images = random_crop_flip(images, indices, seed=seed, epoch=epoch)
        return (images.float() / 255 - mean) / std, labels

    return prepare


def text_step(device: torch.device) -> Callable[[Any, int], tuple[Tensor, Tensor]]:
    def prepare(batch: Any, epoch: int) -> tuple[Tensor, Tensor]:
        return tuple(t.to(device, non_blocking=True) for t in batch)  # type: ignore[return-value]

    return prepare


def join(rank: int, world_size: int, args: argparse.Namespace, port: int) -> torch.device:
    """This process's device; under ``--mode ddp`` it joins the process group first (gloo on CPU, NCCL on GPU)."""
    torch.set_num_threads(args.threads)
    use_cuda = args.accelerator == "gpu"
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if args.mode == "ddp":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    return device


def loader(datamodule: Any, global_batch: int, world_size: int, rank: int, seed: int, pin: bool) -> DataLoader:
    """The data module's training set, in the template's global batch order (``GlobalBatchSampler``)."""
    from multigpu.data.sampling import GlobalBatchSampler

    datamodule.setup("fit")
    sampler = GlobalBatchSampler(datamodule.train_set, global_batch, num_replicas=world_size, rank=rank, seed=seed)
    workers = datamodule.num_workers
    return DataLoader(
        datamodule.train_set,
        batch_size=sampler.micro_batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin and datamodule.pin_memory,
        persistent_workers=workers > 0,
    )


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """The built-in workloads' loss, in fp32: over classes (image) or over every token (language model)."""
    return F.cross_entropy(logits.float().flatten(0, -2) if logits.ndim > 2 else logits.float(), targets.flatten())


def train(rank: int, world_size: int, args: argparse.Namespace, port: int) -> None:
    """One process of the baseline: build, then ``args.steps`` optimizer steps, then write the timings."""
    device = join(rank, world_size, args, port)
    distributed = args.mode == "ddp"
    cli = build_cli(WORKLOADS[args.workload], args.quick, args.batch_size)
    seed = int(cli.config.get("seed_everything") or 0)
    net: nn.Module = cli.model.net.to(device)
    model = DistributedDataParallel(net, device_ids=[rank] if device.type == "cuda" else None) if distributed else net
    optimizer, scheduler = optimizer_and_scheduler(cli.model)  # over the model's parameters: those of its .net
    clip = cli.trainer.gradient_clip_val
    data = loader(cli.datamodule, args.batch_size, world_size, rank, seed, pin=device.type == "cuda")
    image = "CIFAR10" in type(cli.datamodule).__name__
    prepare = image_step(seed, device) if image else text_step(device)
    dtype = AUTOCAST.get("bf16-mixed" if args.precision == "16-mixed" and device.type == "cpu" else args.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    clock = StepClock(device)
    model.train()
    for step, (epoch, new_epoch, batch) in enumerate(batches(data, data.sampler), start=1):
        inputs, targets = prepare(batch, epoch)
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            logits = model(inputs)
        loss = cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        if scheduler is not None:
            scheduler.step()
        clock.step_end(new_epoch=new_epoch)
        if step in (1, args.steps):
            clock.record_loss("first" if step == 1 else "last", loss)  # after the clock read: not timed
        if step == args.steps:
            break
    strategy = "plain DDP" if distributed else "plain loop"
    from multigpu.strategies.model_parallel import (
        memory_per_rank,  # Lightning: as build_cli, not in the launcher
    )

    clock.write(
        args.out,
        rank,
        world_size=world_size,
        strategy=strategy,
        precision=args.precision,
        accumulate_grad_batches=1,
        state_bytes=memory_per_rank(net, [optimizer]),
    )
    if distributed:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    add_workload_arguments(parser)  # a user's model: bare Lightning only (the plain loop is the built-ins' own)
    parser.add_argument(
        "--mode",
        choices=["loop", "ddp", "lightning"],
        default="loop",
        help="one process, DDP processes, or bare Lightning (ddp when --devices > 1)",
    )
    parser.add_argument("--devices", type=int, default=1, help="processes for --mode=ddp or lightning (one per GPU)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--batch-size", type=int, required=True, help="global batch per optimizer step")
    parser.add_argument(
        "--data-batch-size", type=int, help="the data module's batch_size, where it is per process (default: global)"
    )
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps, warm-up included")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--quick", action="store_true", help="the workload's small --quick variant")
    parser.add_argument("--out", required=True, help="JSON file of rank 0 (other ranks write beside it)")
    args = parser.parse_args(argv)
    if args.mode == "loop" and args.devices != 1:
        parser.error("--mode=loop runs one process; use --mode=ddp for --devices > 1")
    if args.mode != "lightning" and (args.model or args.data or args.config):
        parser.error(
            "--model, --data and --config are for --mode=lightning: the plain loop re-implements the training step"
            " of the built-in workloads only (Fix: use --workload, or --mode=lightning)"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.mode == "lightning":
        from benchmarks.bare import train_bare_lightning

        train_bare_lightning(args)
    elif args.mode == "loop":
        train(0, 1, args, port=0)
    else:
        mp.spawn(train, args=(args.devices, args, free_port()), nprocs=args.devices, join=True)


if __name__ == "__main__":
    main()
