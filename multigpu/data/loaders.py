"""The engine's sampling for a user's ``DataLoader``, where Lightning would put its ``DistributedSampler``; all else
the user set is kept (docs/engine.md#your-own-dataloader)."""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import pickle
from collections.abc import Iterator, Mapping, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial, wraps
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from multigpu.data.sampling import GlobalBatchSampler
from multigpu.data.seeding import GeneratorsInUse, in_worker, isolated, sample_seed, seed_generators, seeded_stream
from multigpu.errors import ConfigurationError

GLOBAL_MEANING = "global batch of one optimizer step"
PER_PROCESS_MEANING = "per process (--batch_size_per_process=true)"


@dataclass(frozen=True)
class World:
    """How the training processes share each optimizer step."""

    replicas: int
    rank: int
    accumulate: int
    seed: int
    per_process: bool = False

    def shares(self) -> int:
        return self.replicas * self.accumulate

    def global_batch(self, batch_size: int) -> int:
        return batch_size * self.shares() if self.per_process else batch_size


class EngineSampler(GlobalBatchSampler):
    """``GlobalBatchSampler``'s order over a user's loader; yields ``(index, epoch)`` for ``SeededSamples``."""

    def __init__(self, dataset: Sized, global_batch_size: int, world: World, source: Any = None, **kwargs: Any):
        self.source = source
        self.meaning = PER_PROCESS_MEANING if world.per_process else GLOBAL_MEANING
        super().__init__(
            _Length(len(source) if source is not None else len(dataset)),
            global_batch_size,
            num_replicas=world.replicas,
            rank=world.rank,
            accumulate_grad_batches=world.accumulate,
            seed=world.seed,
            **kwargs,
        )

    def epoch_order(self) -> torch.Tensor:
        if self.source is None:
            return super().epoch_order()
        with isolated():
            seed_generators(sample_seed(self.seed, self.epoch, -1))
            if callable(getattr(self.source, "set_epoch", None)):
                self.source.set_epoch(self.epoch)
            count = self.num_global_batches * self.global_batch_size
            return torch.tensor(list(itertools.islice(iter(self.source), count)), dtype=torch.int64)

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        return zip(super().__iter__(), itertools.repeat(self.epoch))


class _Length(Sized):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class SeededSamples(Dataset):
    """The user's dataset, each sample loaded with generators seeded from the run's seed, the epoch and its index."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.in_use = GeneratorsInUse()

    def __getitem__(self, key: tuple[int, int]) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[Any]:
        # the generators' states saved once per batch, not around each sample
        if in_worker():  # a worker's generators are its own
            return [self._load(key) for key in keys]
        in_use = self.in_use
        with isolated(in_use.python or in_use.probing(), in_use.numpy or in_use.probing()):
            return [self._load(key) for key in keys]

    def _load(self, key: tuple[int, int]) -> Any:
        index, epoch = key
        try:
            return self.in_use.load(sample_seed(self.seed, epoch, index), partial(self.dataset.__getitem__, index))
        except Exception as error:
            mark_origin(error, f"{type(self.dataset).__name__}.__getitem__({index}), the dataset's own code")
            raise

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "seed", "in_use"):  # unpickling asks before they are set
            raise AttributeError(name)
        return getattr(self.dataset, name)


class StreamShare(IterableDataset):
    """This process's micro-batches of every whole global batch of a stream all processes read alike; worker ``w`` of
    ``W`` keeps every ``W``-th, the order a loader delivers them in."""

    def __init__(self, stream: IterableDataset, global_batch_size: int, world: World) -> None:
        self.stream = stream
        self.world = world
        self.global_batch_size = global_batch_size
        self.micro = per_process(global_batch_size, world, f"stream {type(stream).__name__}")
        self.meaning = PER_PROCESS_MEANING if world.per_process else GLOBAL_MEANING
        self.position = torch.zeros(2, dtype=torch.int64).share_memory_()  # (epoch, skip), read by the workers

    def set_position(self, epoch: int, skip: int) -> None:
        self.position[0], self.position[1] = epoch, skip

    def __iter__(self) -> Iterator[Any]:
        from torch.utils.data import get_worker_info

        epoch, skip = (int(v) for v in self.position.tolist())
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        if callable(getattr(self.stream, "set_epoch", None)):
            self.stream.set_epoch(epoch)
        world, micro, size = self.world, self.micro, self.global_batch_size
        mine: list[tuple[int, Any]] = []
        for position, sample in enumerate(seeded_stream(self.stream, sample_seed(world.seed, epoch, -1))):
            step, within = divmod(position, size)
            slot, in_slot = divmod(within, world.replicas * micro)
            if in_slot // micro == world.rank:
                mine.append((step * world.accumulate + slot, sample))
            if within == size - 1:
                yield from (s for k, s in mine if k >= skip and (k - skip) % workers == worker)
                mine = []


class SizedStreamShare(StreamShare):
    def __len__(self) -> int:
        steps = len(self.stream) // self.global_batch_size  # type: ignore[arg-type]
        return steps * self.world.accumulate * self.micro


def per_process(global_batch_size: int, world: World, what: str) -> int:
    shares = world.shares()
    if global_batch_size < 1 or global_batch_size % shares:
        example = shares * max(1, global_batch_size // shares)
        raise ConfigurationError(
            f"the training {what} has batch_size={global_batch_size // (shares if world.per_process else 1)}, the"
            f" {PER_PROCESS_MEANING if world.per_process else GLOBAL_MEANING}, which must divide evenly among"
            f" {world.replicas} process(es) x {world.accumulate} accumulated micro-batch(es) = {shares}. Fix: give the"
            f" loader a batch_size that is a multiple of {shares} (for example {example}; through the data module's"
            " option, e.g. --data.batch_size, where it has one), or change --trainer.devices / --trainer.num_nodes /"
            " --trainer.accumulate_grad_batches"
            + (
                ""
                if world.per_process
                else ", or pass --batch_size_per_process=true to keep Lightning's meaning of batch_size (each"
                " process's micro-batch, the global batch then growing with the processes)"
            )
            + ".",
            every_rank=True,
        )
    return global_batch_size // shares


def digest(sample: Any) -> str:
    """A fingerprint of a sample: tensors by their values (a pickled tensor holds more), anything else pickled."""
    hasher = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
            hasher.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            # flat first: a 0-dim tensor cannot be viewed as bytes
            hasher.update(tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        elif isinstance(value, Mapping):
            for key in value:
                hasher.update(repr(key).encode())
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            hasher.update(f"{type(value).__name__}{len(value)}".encode())
            for item in value:
                walk(item)
        else:
            hasher.update(pickle.dumps(value))

    walk(sample)
    return hasher.hexdigest()


def first_sample(stream: Any, seed: int) -> str:
    """The digest of the first sample this process reads from ``stream``, read in a loader worker: a stream that
    counts its own position (Hugging Face's ``IterableDataset``) stays at its start here, where the training loader's
    workers copy it from."""
    return digest(next(iter(_first(probe(stream, 1, seed), 1)), None))


def plain_batching(loader: DataLoader) -> bool:
    """Whether the batches come from ``batch_size=``, not from a ``batch_sampler=`` of the user's own."""
    return loader.batch_size is not None


def order_source(loader: DataLoader) -> tuple[bool, Any]:
    sampler = loader.sampler
    # torchdata's StatefulDataLoader(shuffle=True) makes a RandomSampler of its own, not a subclass of torch's
    stateful = type(sampler).__module__.startswith("torchdata.") and type(sampler).__name__ == "RandomSampler"
    if (
        (isinstance(sampler, RandomSampler) or stateful)
        and not sampler.replacement
        and sampler.num_samples == len(sampler.data_source)
    ):
        return True, None
    if isinstance(sampler, SequentialSampler):
        return False, None
    return False, sampler


def engine_sampler(loader: DataLoader, world: World, name: str) -> EngineSampler:
    global_batch = world.global_batch(int(loader.batch_size))
    per_process(global_batch, world, name)
    shuffle, source = order_source(loader)
    total = len(source) if source is not None else len(loader.dataset)  # type: ignore[arg-type]
    if global_batch > total:
        raise ConfigurationError(
            f"the training {name} has batch_size={loader.batch_size}, the"
            f" {PER_PROCESS_MEANING if world.per_process else GLOBAL_MEANING}, which is more than its {total}"
            " samples: not one full optimizer step fits in an epoch. Fix: give the loader a smaller batch_size (through"
            " the data module's option, e.g. --data.batch_size, where it has one), or use fewer devices.",
            every_rank=True,
        )
    return EngineSampler(loader.dataset, global_batch, world, source=source, shuffle=shuffle)  # type: ignore[arg-type]


def is_engine_sampled(loader: Any) -> bool:
    """Whether a ``DistributedSampler`` (the user's, or ``EvaluationBatches``) already shares the loader's order."""
    return isinstance(getattr(loader, "sampler", None), DistributedSampler)


def mark_origin(error: BaseException, where: str) -> None:
    if not hasattr(error, "multigpu_origin"):
        error.multigpu_origin = where  # type: ignore[attr-defined]
        error.add_note(f"(raised in {where})")  # a note survives in the traceback torch re-raises from a worker


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class TorchRefusal(ValueError):
    """torch's ``DataLoader`` refused an argument."""


@contextmanager
def torch_refusals() -> Iterator[None]:
    """Raise an error of ``DataLoader.__init__`` as a ``TorchRefusal``, to tell it apart from the user's code's."""
    init = DataLoader.__init__

    @wraps(init)
    def told_apart(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except (ValueError, TypeError) as error:
            raise TorchRefusal(str(error)) from error

    DataLoader.__init__ = told_apart
    try:
        yield
    finally:
        DataLoader.__init__ = init


def loader_refusal(error: BaseException, owner: str) -> ConfigurationError | None:
    if isinstance(error, ConfigurationError) or not isinstance(error, TorchRefusal):
        return error if isinstance(error, ConfigurationError) else None
    option = next((word.split("=")[0] for word in str(error).split() if "=" in word), None)
    named = f" (--data.{option}, or the argument that sets it)" if option else ""
    return ConfigurationError(
        f"{owner} made a loader that torch refused: {one_line(error)}. Fix: change that option{named} to a value"
        " torch's DataLoader accepts."
    )


def workers_differ(stream: Any, seed: int) -> bool:
    return len({digest(sample) for sample in _first(probe(stream, 2, seed), 2)}) > 1


def probe(stream: Any, workers: int, seed: int) -> DataLoader:
    """A loader reading ``stream`` sample by sample in ``workers`` forked workers (they see this process's rank),
    its base seed drawn from a generator of its own: this process's generators and the stream are left as they are."""
    fork = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return DataLoader(
        stream,
        batch_size=None,
        num_workers=workers,
        worker_init_fn=partial(seed_worker, seed),
        multiprocessing_context=fork,
        generator=torch.Generator().manual_seed(seed),
    )


def seed_worker(seed: int, worker_id: int) -> None:
    seed_generators(seed)


def _first(loader: DataLoader, count: int) -> list[Any]:
    iterator = iter(loader)
    try:
        return [sample for _, sample in zip(range(count), iterator, strict=False)]
    finally:
        del iterator


def has_length(stream: Any) -> bool:
    try:
        len(stream)
    except TypeError:
        return False
    return True
