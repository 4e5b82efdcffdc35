"""The loaders a data module or model returns, made again with the engine's sampling in ``setup`` (before anything is
written) and placed at the position a checkpoint saved (docs/engine.md#your-own-dataloader)."""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, IterableDataset

from multigpu.compat import (
    collective_timeout,
    drop_saved_loader_states,
    loader_arguments,
    overrides_hook,
    remade_loader,
    request_train_loaders,
    restart_training_iterator,
    restarted_mid_epoch,
    train_loader_source,
    uses_distributed_sampler,
)
from multigpu.data.base import own_training_loader
from multigpu.data.libraries import StatePerBatch, shards_itself
from multigpu.data.loaders import (
    EngineSampler,
    SeededSamples,
    SizedStreamShare,
    StreamShare,
    World,
    engine_sampler,
    first_sample,
    has_length,
    is_engine_sampled,
    loader_refusal,
    mark_origin,
    one_line,
    plain_batching,
    torch_refusals,
    workers_differ,
)
from multigpu.data.position import (
    Position,
    gathered,
    load_loader_state,
    read_position,
    restores_itself,
    saved_position,
    stateful_loaders,
)
from multigpu.data.sampling import BatchedDataset, EvaluationBatches, global_seed
from multigpu.data.seeding import sample_seed
from multigpu.data.topology import data_parallel_world
from multigpu.data.train_batches import TrainBatches, drawn_ahead
from multigpu.errors import ConfigurationError, notice

HOOK = "train_dataloader"
EVALUATION_HOOKS = ("val_dataloader", "test_dataloader")


class EngineLoaders(Callback):
    """Put the engine's sampling into the loaders; ``per_process``: ``batch_size`` is each process's micro-batch."""

    samples_training_loaders = True  # GlobalBatchDataModule then returns a plain loader for it to sample

    def __init__(self, per_process: bool = False) -> None:
        self.per_process = per_process
        self._source: Any = None
        self._built: Any = None
        self._position: Position | None = None
        self._engine: list[tuple[Any, bool]] = []  # (sampler or stream share, whether its loader restores itself)
        self._kept: list[tuple[str, str]] = []
        # self-sharding loaders seed their workers at the first batch: from the global generator a resume would differ
        self._seeded: list[DataLoader] = []
        self._positioned: list[StatePerBatch] = []
        self._uneven = False
        self._even_group: Any = None  # the ranks' gloo group for TrainBatches, made once per fit
        self._batches: TrainBatches | None = None
        self._handed: Any = None  # the training loaders last handed to Lightning
        self.fitting: L.Trainer | None = None
        self._wrapped: Any = None
        self._evaluated: list[str] = []
        self._samples = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        source = train_loader_source(trainer)
        if not isinstance(source, (L.LightningModule, L.LightningDataModule)):
            return
        # overfit_batches: Lightning reads the first batches in order, with a sampler of its own
        sampled = uses_distributed_sampler(trainer) or own_training_loader(source)
        self._samples = sampled and not trainer.overfit_batches
        self._evaluated = [hook for hook in EVALUATION_HOOKS if overrides_hook(source, hook)] if self._samples else []
        for hook in self._evaluated:
            setattr(source, hook, partial(self._evaluation_loaders, trainer, getattr(source, hook), hook))
        self._wrapped = source
        if stage != "fit" or not overrides_hook(source, HOOK):
            return
        self._source = source
        original = getattr(source, HOOK)
        if self._samples:
            self._built = self._build(trainer, lambda: request_train_loaders(trainer))
            if not self._engine and not stateful_loaders(self._built) and not isinstance(self._built, TrainBatches):
                self._built = None  # every loader left as it is: Lightning asks the hook itself, as without the engine
                return

        def train_dataloader() -> Any:
            built, self._built = self._built, None
            if built is None and self._samples:  # asked again (reload_dataloaders_every_n_epochs): made again
                built = self._build(trainer, original)
            elif built is None:
                built = original()
            self._batches = built if isinstance(built, TrainBatches) else None
            self._handed = built
            self._resume(trainer, built)
            return built

        setattr(source, HOOK, train_dataloader)

    @property
    def active(self) -> bool:
        """Whether this fit's training loaders were asked for through this callback, with the engine's sampling."""
        return self._source is not None and self._samples

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._wrapped is not None:
            for hook in [HOOK, *self._evaluated]:
                vars(self._wrapped).pop(hook, None)
        self._source = self._built = self._wrapped = self._even_group = None

    def _evaluation_loaders(self, trainer: L.Trainer, ask: Any, hook: str) -> Any:
        loaders = ask()
        world = self._world(trainer)
        if world.replicas == 1:
            return loaders
        owner = f"{type(self._wrapped).__name__}.{hook}()"
        if isinstance(loaders, CombinedLoader):
            loaders.flattened = [self._evaluation(loader, world, owner) for loader in loaders.flattened]
            return loaders
        if isinstance(loaders, (list, tuple)):
            return type(loaders)(self._evaluation(loader, world, owner) for loader in loaders)
        if isinstance(loaders, dict):
            return {key: self._evaluation(loader, world, owner) for key, loader in loaders.items()}
        return self._evaluation(loaders, world, owner)

    def _evaluation(self, loader: Any, world: World, owner: str) -> Any:
        """``EvaluationBatches`` over a plain loader: every sample once (Lightning's sampler pads with repeats)."""
        if (
            not isinstance(loader, DataLoader)
            or is_engine_sampled(loader)
            or isinstance(loader.dataset, IterableDataset)
        ):
            return loader
        if not plain_batching(loader):
            return loader
        try:
            batches = EvaluationBatches(
                loader.dataset, world.global_batch(int(loader.batch_size)), num_replicas=world.replicas, rank=world.rank
            )
        except ValueError as error:
            raise ConfigurationError(
                f"the loader of {owner} has batch_size={loader.batch_size}: {error}", every_rank=True
            ) from error
        dataset = BatchedDataset(loader.dataset, loader.collate_fn)
        return self._remake_as(loader, owner, batches, dataset, batch_size=None, collate_fn=None)

    def _world(self, trainer: L.Trainer) -> World:
        data_parallel = data_parallel_world(trainer.strategy)
        replicas, rank = data_parallel or (trainer.world_size, trainer.global_rank)
        per_process = self.per_process and not own_training_loader(self._wrapped)
        return World(replicas, rank, trainer.accumulate_grad_batches, global_seed(), per_process)

    def _build(self, trainer: L.Trainer, ask: Any) -> Any:
        owner = f"{type(self._source).__name__}.{HOOK}()"
        try:
            with torch_refusals():
                loaders = ask()
        except Exception as error:
            refusal = loader_refusal(error, owner)
            if refusal is not None:
                raise refusal from error
            mark_origin(error, f"{owner}, the {kind(self._source)}'s own code")
            raise
        world = self._world(trainer)
        self._engine, self._kept, self._seeded, self._positioned, self._uneven = [], [], [], [], False
        if isinstance(loaders, DataLoader):
            rebuilt = self._rebuild(loaders, world, f"loader of {owner}")
            even = self._even_across(trainer)
            return TrainBatches(rebuilt, even) if self._uneven or drawn_ahead(rebuilt) else rebuilt
        combined = loaders if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders, "max_size_cycle")
        combined.flattened = [
            self._rebuild(loader, world, f"loader {index} of {owner}")
            for index, loader in enumerate(combined.flattened)
        ]
        if (self._uneven or any(map(drawn_ahead, combined.flattened))) and not isinstance(loaders, CombinedLoader):
            # a CombinedLoader of the user's keeps its mode
            return TrainBatches(combined.iterables, self._even_across(trainer))
        return combined

    def _even_across(self, trainer: L.Trainer) -> Any:
        """The group whose ranks end an epoch of uneven shards together, or None: made once, by every rank here, as
        every rank builds its loaders and finds them uneven at the same point."""
        if self._uneven and self._even_group is None:
            self._even_group = dist.new_group(backend="gloo", timeout=collective_timeout(trainer.strategy))
        return self._even_group if self._uneven else None

    def _rebuild(self, loader: Any, world: World, name: str) -> Any:
        if shards_itself(loader):  # rebuilt, it would lose its sharding; its own state resumes it
            if loader.generator is None:
                self._seeded.append(loader)
            if not restores_itself(loader):
                self._kept.append((name, "it shards itself and its loader keeps no position: its library's own does"))
            return loader
        if not isinstance(loader, DataLoader) or is_engine_sampled(loader):
            if isinstance(loader, DataLoader) and not isinstance(loader.sampler, EngineSampler):
                self._kept_if_unresumable(loader, name)
            return loader
        if isinstance(loader.dataset, IterableDataset):
            return self._stream(loader, world, name)
        if not plain_batching(loader):
            own = loader.batch_sampler
            what = f"a batch_sampler of its own ({type(own).__name__})" if own is not None else "batch_size=None"
            if world.replicas > 1:
                raise ConfigurationError(
                    f"the training {name} has {what}, whose batches the engine cannot share among the"
                    f" {world.replicas} processes so that they train what one process trains. Fix: give the DataLoader"
                    " batch_size= (and a sampler= for an order of your own: the engine keeps it), or set"
                    " --trainer.use_distributed_sampler=false to keep it as it is (every process then reads what it"
                    " yields, and shards it itself).",
                    every_rank=True,
                )
            self._kept.append((name, f"it has {what}, which decides the batches"))
            return loader
        sampler = engine_sampler(loader, world, name)
        samples = SeededSamples(loader.dataset, world.seed)
        remade = self._remake_as(loader, name, sampler, samples, batch_size=sampler.micro_batch_size)
        self._engine.append((sampler, restores_itself(remade)))
        return remade

    def _stream(self, loader: DataLoader, world: World, name: str) -> DataLoader:
        stream = loader.dataset
        label = f"{name} (stream {type(stream).__name__})"
        if loader.batch_size is None:
            self._kept.append((label, "it has batch_size=None"))
            return loader
        if world.replicas > 1 and len(set(gathered(first_sample(stream, world.seed)))) > 1:
            # the processes read different samples: it shards itself by rank, and a rank may run out first
            self._uneven = True
            stream_state = restores_itself(stream) and not restores_itself(loader)
            if stream_state and loader.num_workers == 0:
                return self._positioned_stream(loader, label)
            if restores_itself(loader):
                return loader
            why = "it shards itself by rank and the engine cannot skip in it"
            if stream_state:  # each worker holds a copy of the stream, whose position this one lacks
                why += " (its position lives in the loader workers: torchdata's StatefulDataLoader saves it)"
            self._kept.append((label, why))
            return loader
        if loader.num_workers > 1 and workers_differ(stream, world.seed):
            if world.replicas > 1:
                raise ConfigurationError(
                    f"the training {label} shards itself among loader workers but not among the {world.replicas}"
                    " processes: every process would train on the same samples. Fix: shard it by rank too"
                    " (torch.distributed.get_rank() and get_world_size(), or the streaming library's split by node),"
                    " or let every worker read the whole stream: the engine then gives each process its share.",
                    every_rank=True,
                )
            self._kept.append((label, "it shards itself among loader workers and the engine cannot skip in it"))
            return loader
        share_class = SizedStreamShare if has_length(stream) else StreamShare
        share = share_class(stream, world.global_batch(int(loader.batch_size)), world)
        remade = self._remake_as(loader, label, None, share, batch_size=share.micro)
        self._engine.append((share, restores_itself(remade)))
        return remade

    def _positioned_stream(self, loader: DataLoader, label: str) -> DataLoader:
        positions = StatePerBatch(loader.dataset, int(loader.batch_size))
        self._positioned.append(positions)
        return self._remake_as(loader, label, None, positions, drop_last=loader.drop_last)

    def _remake_as(self, loader: DataLoader, name: str, sampler: Any, dataset: Any, **changes: Any) -> DataLoader:
        # the workers' base seed from a generator of the loader's own: the training step's draws stay as they were
        generator = loader.generator if loader.generator is not None else torch.Generator()
        try:
            args, kwargs = loader_arguments(loader, sampler)
            if "batch_size" in changes:
                kwargs.update(batch_sampler=None, sampler=sampler, shuffle=False)
            changes = {"drop_last": False, **changes, "dataset": dataset, "generator": generator}
            return remade_loader(loader, *args, **{**kwargs, **changes})
        except Exception as error:
            raise ConfigurationError(
                f"the training {name} ({type(loader).__name__}) cannot be made again with the engine's sampling:"
                f" {one_line(error)}. Fix: return a torch.utils.data.DataLoader (or a subclass whose __init__ takes"
                " DataLoader's arguments), or shard it with its library's own split by rank (LitData's"
                " StreamingDataset does, the engine keeps it; Hugging Face's"
                " datasets.distributed.split_dataset_by_node; WebDataset's split_by_node)"
                " and set --trainer.use_distributed_sampler=false to keep it as it is.",
                every_rank=True,
            ) from error

    def _kept_if_unresumable(self, loader: DataLoader, name: str) -> None:
        if not restores_itself(loader):
            self._kept.append((name, f"its sampler ({type(loader.sampler).__name__}) is its own"))

    def _resume(self, trainer: L.Trainer, built: Any) -> None:
        position, self._position = self._position, None
        epoch, skip = position.start() if position is not None else (trainer.current_epoch, 0)
        restored = self._restore_states(trainer, built, position) if position is not None else None
        self._seed_workers(epoch)
        for positions in self._positioned:
            positions.set_epoch(epoch)
        for item, itself in self._engine:
            done = 0 if itself and restored is not False else skip  # a StatefulDataLoader skips itself
            if isinstance(item, EngineSampler):
                item.set_epoch(epoch)
                if done:
                    item.resume_from(epoch, done)
            else:
                item.set_position(epoch, done)

    def _restore_states(self, trainer: L.Trainer, built: Any, position: Position) -> bool | None:
        """Give each stateful loader this rank's saved state: whether the world size is the same (None: none saved)."""
        if position.states is None:
            return None
        loaders = stateful_loaders(built)
        saved_world, ranks = position.states["world_size"], position.states["ranks"]
        if saved_world == trainer.world_size:
            self._give(built, list(zip(loaders, ranks[trainer.global_rank], strict=True)), position.batches_done)
            if isinstance(built, TrainBatches):
                built.start_at(position.batches_done)
            return True
        # another world size: a loader that shards itself gets a saved rank's state and re-stripes from it
        sampled = {id(item) for item, _ in self._engine}
        own = [loader for loader in loaders if id(engine_owner(loader)) not in sampled]
        self._give(built, list(zip(own, ranks[trainer.global_rank % saved_world], strict=False)), position.batches_done)
        if own and trainer.is_global_zero:
            names = ", ".join(type(loader).__name__ for loader in own)
            notice(
                f"the checkpoint was written by {saved_world} process(es) and this run has {trainer.world_size}: the"
                f" training {names} shards itself by the number of processes, so it resumes from its saved position"
                " with its samples striped anew among the processes, and trains another order than an uninterrupted"
                f" run on {trainer.world_size} would."
            )
        return False

    @staticmethod
    def _give(built: Any, given: list[tuple[Any, Any]], batches_done: int) -> None:
        for loader, state in given:
            load_loader_state(loader, state, batches_done)
            if isinstance(built, TrainBatches):
                built.give(loader, state)

    def _seed_workers(self, epoch: int) -> None:
        for loader in self._seeded:
            loader.generator = torch.Generator().manual_seed(sample_seed(global_seed(), epoch, -1))

    def state_dict(self) -> dict[str, Any]:
        return saved_position(self.fitting, self._batches).entry() if self.fitting is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = read_position(state_dict)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.state_key in checkpoint.get("callbacks", {}):
            # this callback restores every rank's own; Lightning would give every rank rank 0's, or none (1.x
            # saved GlobalBatchDataModule's position there too, for a loader that now keeps none)
            drop_saved_loader_states(checkpoint)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fitting = trainer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._position is not None and self._handed is not None:
            # restored after the loaders were handed out and their iterator made (fsdp2 builds the optimizers, which
            # may read estimated_stepping_batches, before it restores the callbacks): placed now, iterator made again
            self._resume(trainer, self._handed)
            restart_training_iterator(trainer)
        if restarted_mid_epoch(trainer):
            for name, why in self._kept:
                notice(
                    f"the training {name} cannot resume in the middle of its epoch ({why}): it starts the epoch"
                    " again, so this run trains on other batches than an uninterrupted one would."
                )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seed_workers(trainer.current_epoch)
        for positions in self._positioned:
            positions.set_epoch(trainer.current_epoch)
        for item, _ in self._engine:
            if isinstance(item, StreamShare):
                item.set_position(trainer.current_epoch, 0)  # the workers read it when the epoch's iterator starts


def engine_owner(loader: Any) -> Any:
    return loader.sampler if isinstance(loader.sampler, EngineSampler) else loader.dataset


def kind(source: Any) -> str:
    return "model" if isinstance(source, L.LightningModule) else "data module"
