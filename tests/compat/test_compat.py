"""``multigpu/compat/``, proven on real objects: a fast test for each function and for each protected hook a subclass
overrides (``OVERRIDDEN_HOOKS``), run on a real Trainer and its loops, a real strategy or a real ``ModelCheckpoint``.
Each fails when a library release changes the behaviour the template relies on, whatever the library's source looks
like. The last section scans ``multigpu/`` and ``src/``: a private name used outside ``multigpu/compat/`` fails.
"""

from __future__ import annotations

import ast
import importlib
import re
import signal
import socket
import subprocess
import sys
import types
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy, StrategyRegistry
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from multigpu import compat
from multigpu.checkpoints.continuation import uncount_epoch_end
from multigpu.strategies import DataParallelStrategy
from multigpu.strategies.dp import ParallelForward
from tests.compat.conftest import BATCHES, Hooks, tiny_data, trainer
from tests.conftest import REPO
from tests.fixtures.workload import TinyClassifier


class Rows(Logger):
    """A logger that keeps the ``(step, names)`` of every row it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, set[str]]] = []

    @property
    def name(self) -> str:
        return "rows"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, set(metrics)))


# -- Lightning: the fit loop's counters and switches --------------------------------------------------------


def test_attached_trainer_is_none_before_fit_and_the_trainer_during_it():
    model, seen = BoringModel(), []
    assert compat.attached_trainer(model) is None
    fit = trainer(callbacks=[Hooks(on_train_start=lambda t: seen.append(compat.attached_trainer(t.lightning_module)))])
    fit.fit(model)
    assert seen == [fit]


def test_batch_and_epoch_counters_count_what_the_template_reads():
    seen = []

    def record(t: L.Trainer, index: int) -> None:
        current = compat.batch_progress(t).current
        seen.append(
            (index, current.ready, current.processed, current.completed, compat.batch_progress(t).is_last_batch)
        )

    fit = trainer(max_steps=BATCHES + 1, callbacks=[Hooks(on_train_batch_end=record)])
    fit.fit(BoringModel())
    # in on_train_batch_end the batch is ready and processed, not yet completed; the last one of an epoch says so
    assert seen[:BATCHES] == [(i, i + 1, i + 1, i, i == BATCHES - 1) for i in range(BATCHES)]
    assert seen[BATCHES] == (0, 1, 1, 0, False)  # the next epoch counts from 0
    # a fit that stops mid-epoch (after one batch of the second epoch) ends with that epoch counted as finished
    batches, epochs = compat.batch_progress(fit), compat.epoch_progress(fit)
    assert (batches.current.completed, batches.total.completed, batches.is_last_batch) == (1, BATCHES + 1, False)
    assert (epochs.current.processed, epochs.current.completed, fit.current_epoch) == (2, 2, 2)


@pytest.fixture(scope="module")
def mid_epoch_checkpoint(tmp_path_factory) -> Path:
    """A fit stopped after 2 of 4 batches (a plain DataLoader, which cannot restore its position), saved after
    ``uncount_epoch_end``."""
    fit = trainer(max_steps=2)
    fit.fit(BoringModel())
    uncount_epoch_end(fit)
    assert compat.epoch_progress(fit).current.completed == 0 and fit.current_epoch == 0
    assert compat.batch_progress(fit).current.completed == 1
    path = tmp_path_factory.mktemp("mid_epoch") / "mid.ckpt"
    fit.save_checkpoint(path, weights_only=False)
    return path


def resumed_positions(checkpoint: Path, **hooks: Callable[..., Any]) -> tuple[list[Any], list[str]]:
    """``(epoch, batch index)`` of each batch a fit resumed from ``checkpoint`` trains (to 4 steps), after what the
    hooks record, and the warnings it gave."""
    seen: list[Any] = []
    start = hooks.pop("on_train_start", lambda t: None)
    probe = Hooks(
        on_train_start=lambda t: seen.append(start(t)),
        on_train_batch_end=lambda t, i: seen.append((t.current_epoch, i)),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks.pop("filters", lambda: None)()
        trainer(max_steps=4, callbacks=[probe]).fit(BoringModel(), ckpt_path=checkpoint)
    return seen, [str(warning.message) for warning in caught]


def test_restarted_mid_epoch_after_an_uncounted_epoch_end_not_after_lightnings_count(mid_epoch_checkpoint, tmp_path):
    seen, _ = resumed_positions(mid_epoch_checkpoint, on_train_start=compat.restarted_mid_epoch)
    assert seen == [True, (0, 2), (0, 3)]  # the epoch's last two batches
    # as Lightning leaves its counters (the stopped epoch counted), the same stop resumes in a new epoch
    fit = trainer(max_steps=2)
    fit.fit(BoringModel())
    fit.save_checkpoint(tmp_path / "counted.ckpt", weights_only=False)
    seen, _ = resumed_positions(tmp_path / "counted.ckpt", on_train_start=compat.restarted_mid_epoch)
    assert seen[0] is False and seen[1][0] == 1


RESUME_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def test_the_mid_epoch_resume_warning_comes_from_the_module_compat_names(mid_epoch_checkpoint):
    _, messages = resumed_positions(mid_epoch_checkpoint)
    assert any(RESUME_WARNING in message for message in messages)  # multigpu/errors/quiet.py's filter still has a job

    def ignore() -> None:
        warnings.filterwarnings("ignore", message=RESUME_WARNING, module=compat.mid_epoch_resume_warning_module())

    _, messages = resumed_positions(mid_epoch_checkpoint, filters=ignore)
    assert not any(RESUME_WARNING in message for message in messages)


def test_the_pytree_warning_comes_from_the_module_compat_names():
    """If the first half fails, Lightning no longer calls torch's deprecated check: delete the filter in
    ``multigpu/errors/quiet.py`` and ``compat.pytree_warning_module``."""

    def warned(*filters: str) -> bool:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for module in filters:
                warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning, module=module)
            trainer(max_steps=1).fit(BoringModel())  # Lightning flattens each batch with its pytree helper
        return any("LeafSpec" in str(warning.message) for warning in caught)

    assert warned()
    assert not warned(compat.pytree_warning_module())


def test_resetting_the_batch_position_and_starting_afresh_resume_the_next_epoch_from_its_start(tmp_path):
    """Under ``max_steps`` Lightning restarts the epoch loop on every resume; after an epoch that ended (and
    validated) it counts one logging step too many unless the switch is turned off."""
    fit = trainer(max_steps=BATCHES, limit_val_batches=1)  # one whole epoch, validated at its end
    fit.fit(TinyClassifier(), tiny_data())
    compat.reset_batch_position(fit)
    assert compat.batch_progress(fit).current.completed == 0 and compat.batch_progress(fit).total.completed == BATCHES
    fit.save_checkpoint(tmp_path / "end.ckpt", weights_only=False)

    def resume(afresh: bool) -> list[Any]:
        seen: list[Any] = []

        def start(t: L.Trainer) -> None:
            seen.append(compat.epoch_loop_restarting(t))
            if afresh:
                compat.start_next_epoch_afresh(t)

        probe = Hooks(on_train_start=start, on_train_batch_end=lambda t, i: seen.append((i, compat.logging_step(t))))
        trainer(max_steps=BATCHES + 2, limit_val_batches=1, callbacks=[probe]).fit(
            TinyClassifier(), tiny_data(), ckpt_path=tmp_path / "end.ckpt"
        )
        return seen

    assert resume(afresh=True) == [True, (0, BATCHES), (1, BATCHES + 1)]
    assert resume(afresh=False) == [True, (0, BATCHES + 1), (1, BATCHES + 2)]  # what the switch prevents


def test_logging_step_is_the_step_of_the_rows_lightning_logs_and_a_checkpoint_keeps_it(tmp_path):
    logger, seen = Rows(), []

    def start(t: L.Trainer) -> None:
        compat.set_logging_step(t, 40)

    probe = Hooks(on_train_start=start, on_train_batch_end=lambda t, i: seen.append(compat.logging_step(t)))
    fit = trainer(max_steps=3, logger=logger, log_every_n_steps=1, callbacks=[probe])
    fit.fit(TinyClassifier(), tiny_data())
    assert [step for step, names in logger.rows if "train/loss" in names] == seen == [40, 41, 42]
    fit.save_checkpoint(tmp_path / "last.ckpt", weights_only=False)
    resumed: list[int] = []
    again = trainer(max_steps=4, callbacks=[Hooks(on_train_start=lambda t: resumed.append(compat.logging_step(t)))])
    again.fit(TinyClassifier(), tiny_data(), ckpt_path=tmp_path / "last.ckpt")
    assert resumed == [43]


def validations_after(**hooks: Callable[..., Any]) -> tuple[list[int], list[int]]:
    """(the batches after which ``validation_follows`` said yes, the global steps validation ran at) of a fit that
    validates every 2 of its 4 batches."""
    said, ran = [], []
    run_hook = hooks.pop("on_train_batch_end", lambda t, i: None)

    def batch_end(t: L.Trainer, index: int) -> None:
        if compat.validation_follows(t):
            said.append(index)
        run_hook(t, index)

    probe = Hooks(on_train_batch_end=batch_end, on_validation_start=lambda t: ran.append(t.global_step))
    trainer(max_steps=BATCHES, limit_val_batches=1, val_check_interval=2, callbacks=[probe]).fit(BoringModel())
    return said, ran


def test_validation_follows_is_the_loops_own_decision_and_skip_next_validation_cancels_one():
    assert validations_after() == ([1, 3], [2, 4])

    def skip_first(t: L.Trainer, index: int) -> None:
        if index == 1:
            compat.skip_next_validation(t)

    assert validations_after(on_train_batch_end=skip_first) == ([1, 3], [4])


class WithoutValidationStep(BoringModel):
    validation_step = L.LightningModule.validation_step  # the hook as LightningModule has it: not implemented


def test_overrides_hook_decides_as_lightning_decides_to_validate():
    ran: list[str] = []
    for model, implemented in ((BoringModel(), True), (WithoutValidationStep(), False)):
        assert compat.overrides_hook(model, "validation_step") is implemented
        name = type(model).__name__
        probe = Hooks(on_validation_start=lambda t, name=name: ran.append(name))
        trainer(max_steps=BATCHES, limit_val_batches=1, callbacks=[probe]).fit(model)
    assert set(ran) == {"BoringModel"}  # Lightning validates the one model that implements the hook


class TwoRanks(SingleDeviceStrategy):
    """Test-only: one CPU process that reports a world of two, the case where Lightning broadcasts per step."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))
        self.world_size = 2


def test_the_per_step_sigterm_broadcast_is_still_there_and_skipped(one_process_group, monkeypatch):
    """If the first assertion fails, Lightning no longer runs a per-step collective: delete
    ``skip_per_step_sigterm_broadcast``."""
    loop_class = type(trainer().fit_loop.epoch_loop)
    calls: list[int] = []
    monkeypatch.setattr(loop_class, "_broadcast_sigterm_tensor", lambda self: calls.append(1))
    trainer(max_steps=3, strategy=TwoRanks()).fit(BoringModel())
    assert len(calls) == 3  # one collective per step
    calls.clear()
    skipped: list[bool] = []
    probe = Hooks(on_train_start=lambda t: skipped.append(compat.skip_per_step_sigterm_broadcast(t)))
    trainer(max_steps=3, strategy=TwoRanks(), callbacks=[probe]).fit(BoringModel())
    assert skipped == [True] and calls == []


# -- Lightning: strategies, launchers, callbacks ------------------------------------------------------------


def test_registered_strategy_rebuilds_what_the_trainer_builds_from_the_name():
    from multigpu.strategies import register_strategies

    register_strategies()
    checked = []
    for name in StrategyRegistry.available_strategies():
        try:
            expected = StrategyRegistry.get(name)  # Lightning's own construction from the name
        except Exception:
            continue  # an optional package is missing (deepspeed, xla)
        registered = compat.registered_strategy(name)
        assert registered is not None, name
        strategy_class, params = registered
        built = strategy_class(**params)
        assert type(built) is type(expected), name
        mine, lightnings = vars(built), vars(expected)
        assert mine.keys() == lightnings.keys(), name
        assert all(mine[k] == lightnings[k] or type(mine[k]) is type(lightnings[k]) for k in mine), name
        checked.append(name)
    assert {"ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "dp", "fsdp2"} <= set(checked)
    assert compat.registered_strategy("ddp_spawn")[1] == {"start_method": "spawn"}
    assert compat.registered_strategy("no_such_strategy") is None


def test_released_ranks_are_no_longer_watched_by_lightnings_observer():
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    def sleeper() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    stopped = subprocess.Popen([sys.executable, "-c", "raise SystemExit(75)"])  # a rank that saved and stopped
    stopped.wait(timeout=30)
    for released in (False, True):
        fit = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False, enable_checkpointing=False)
        fit.strategy.launcher.procs.append(stopped)
        launching = sleeper()  # stands in for the process that started the rank
        observer = _ChildProcessObserver(main_pid=launching.pid, child_processes=fit.strategy.launcher.procs)
        if released:
            assert compat.release_started_processes(fit) == [stopped]
            assert compat.release_started_processes(fit) == [stopped]  # a second call: the same processes
        assert observer._run() is True  # one look, and its watch is over
        if released:
            assert launching.poll() is None  # it killed nothing
            launching.kill()
        else:
            assert launching.wait(timeout=10) == -signal.SIGKILL  # what the release prevents
    assert compat.release_started_processes(trainer()) == []  # no launcher: nothing started


@pytest.fixture
def free_port(monkeypatch) -> None:
    """The address Lightning's environment gives ``init_process_group``, put back afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))


def test_model_parallel_strategy_creates_its_process_group_and_mesh_with_what_compat_set(free_port, monkeypatch):
    strategy = trainer(strategy=ModelParallelStrategy(timeout=timedelta(seconds=12))).strategy
    strategy.connect(BoringModel())
    timeouts = []
    init = dist.init_process_group

    def recording_init(*args: Any, **kwargs: Any) -> None:
        timeouts.append(kwargs.get("timeout"))
        init(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", recording_init)
    compat.set_mesh_sizes(strategy, data_parallel=1, tensor_parallel=2)
    try:
        with pytest.raises(RuntimeError):  # 1 x 2 is not the world size of 1: the sizes set are the ones used
            strategy.setup_environment()
        assert timeouts == [timedelta(seconds=12)] == [compat.collective_timeout(strategy)]
        compat.set_mesh_sizes(strategy, data_parallel=1, tensor_parallel=1)
        strategy.setup_environment()
        assert strategy.device_mesh.shape == (1, 1)
        assert strategy.device_mesh.mesh_dim_names == ("data_parallel", "tensor_parallel")
        # another mesh (pipeline's 3-D one) for the strategy and the module's configure_model alike
        names = ("pipeline", "data_parallel", "tensor_parallel")
        mesh = dist.device_mesh.init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=names)
        compat.set_device_mesh(strategy, mesh)
        assert strategy.device_mesh is mesh and strategy.lightning_module.device_mesh is mesh
        assert strategy.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_collective_timeout_is_the_timeout_a_strategy_was_built_with():
    for strategy_class in (DDPStrategy, ModelParallelStrategy):
        assert compat.collective_timeout(strategy_class(timeout=timedelta(seconds=12))) == timedelta(seconds=12)


def test_a_strategys_ranks_join_within_the_start_bound_and_its_collectives_wait_its_timeout():
    start = timedelta(minutes=30)
    for timeout in (timedelta(seconds=5), timedelta(hours=2)):  # shorter than the start bound, and longer
        strategy = DDPStrategy(timeout=timeout)
        L.Trainer(accelerator="cpu", strategy=strategy, devices=1, logger=False)
        try:
            with compat.ranks_join_within(strategy, start):
                strategy.setup_environment()  # Lightning's init_process_group, with its real rendezvous
            assert dist.distributed_c10d._get_default_store().timeout == max(start, timeout)
            assert dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout == timeout
            assert compat.collective_timeout(strategy) == timeout
        finally:
            dist.destroy_process_group()


def test_a_strategy_registered_with_options_builds_with_them_inside_the_block_only():
    plain = compat.registered_strategy("ddp")
    with compat.registered_with("ddp", {"timeout": timedelta(seconds=7)}):
        built = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False).strategy
        assert compat.collective_timeout(built) == timedelta(seconds=7)
    assert compat.registered_strategy("ddp") == plain
    with compat.registered_with("ddp", {"timeout": timedelta(seconds=7)}, RecordingDDP):
        built = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False).strategy
        assert type(built) is RecordingDDP and compat.collective_timeout(built) == timedelta(seconds=7)
    assert compat.registered_strategy("ddp") == plain


class RecordingDDP(DDPStrategy):
    """Test-only: a subclass of the class ``ddp`` names, built in its place."""


class RecordingDataParallel(DataParallelStrategy):
    """Test-only: dp whose ``_setup_model`` (the protected hook of its base class) puts its parallel forward on
    the module on the CPU too, and records where the module was when the hook ran."""

    def _setup_model(self, model: nn.Module) -> nn.Module:
        self.model_device_at_setup = next(model.parameters()).device
        model.forward = CountingForward(model, self.parallel_devices or [])
        return model


class CountingForward(ParallelForward):
    calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CountingForward.calls += 1
        return super().__call__(*args, **kwargs)


def test_strategy_setup_hands_the_model_to_setup_model_after_moving_it_and_keeps_what_it_returns():
    model, strategy = BoringModel(), RecordingDataParallel()
    own_forward: list[Any] = []
    probe = Hooks(on_train_start=lambda t: own_forward.append(vars(t.lightning_module).get("forward")))
    CountingForward.calls = 0
    trainer(max_steps=2, strategy=strategy, callbacks=[probe]).fit(model)
    assert strategy.model_device_at_setup == strategy.root_device
    assert isinstance(own_forward[0], CountingForward) and CountingForward.calls == 2  # self(x) in each step
    assert "forward" not in vars(model)  # the strategy's teardown took it off again


def test_available_flops_is_lightnings_table_of_device_peaks(monkeypatch):
    assert compat.available_flops(torch.device("cpu"), torch.float32) is None
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10G")
    assert compat.available_flops(cuda, torch.bfloat16) == 125e12
    assert compat.available_flops(cuda, "tfloat32") == 62.5e12  # the name the template gives TF32
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert compat.available_flops(cuda, torch.bfloat16) is None


def test_a_hook_on_the_instance_is_what_lightning_calls_and_overrides_hook_counts():
    """What the sharding policy and the loaders rely on when they put a hook on the user's module itself."""
    model, calls = BoringModel(), []
    model.configure_model = types.MethodType(lambda self: calls.append(self), model)
    assert compat.overrides_hook(model, "configure_model")
    assert not compat.overrides_hook(BoringModel(), "configure_model")
    trainer(max_steps=1).fit(model)
    assert calls == [model]
    del model.configure_model
    assert not compat.overrides_hook(model, "configure_model")


# -- the seam: nothing else in multigpu/ or src/ reaches into a library's internals ------------------------------

#: names of the Python standard library's documented API that start with an underscore (namedtuple's, and
#: ``os._exit``)
PUBLIC_UNDERSCORE_NAMES = {"_make", "_fields", "_asdict", "_replace", "_exit"}
#: the Trainer's loops: their classes are private, and so is everything the template reads or changes in them
LOOPS = {"fit_loop", "epoch_loop", "validate_loop", "test_loop", "predict_loop"}
#: a private module of the libraries, spelled in a string (a ``warnings`` filter's pattern, an import path)
PRIVATE_MODULE = re.compile(r"(lightning|torch|torchmetrics|jsonargparse)(\\?\.\w+)*\\?\._[a-z]")
#: the libraries' undocumented names that have no underscore, and the modules that only hold such names: only
#: multigpu/compat.py spells them
UNDOCUMENTED_NAMES = {
    "scatter_kwargs",
    "get_available_flops",
    "default_pg_timeout",
    "is_overridden",
    *compat.STAGE_WORK,
}
UNDOCUMENTED_ATTRIBUTES = {"callback_keys", "restarting", "restarted_mid_epoch", "reset_on_run"}
UNDOCUMENTED_KEYS = {"init_params"}
UNDOCUMENTED_MODULES = {
    "lightning.pytorch.utilities.model_summary.model_summary",  # the package exports what the template uses
    "lightning.pytorch.utilities.model_helpers",
    "lightning.fabric.plugins.collectives.torch_collective",
    "lightning.fabric.utilities.throughput",  # lightning.fabric.utilities exports what is public
    "torch.nn.parallel.scatter_gather",  # torch.nn.parallel exports what is public
}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE_NAMES


def on_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def own_names(tree: ast.AST) -> set[str]:
    """The private names the template's own code defines: its functions, classes and variables, and the
    attributes it assigns on ``self`` / ``cls``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and on_self(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if private(name)}


def docstring_ids(tree: ast.AST) -> set[int]:
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, scopes) and node.body and isinstance(node.body[0], ast.Expr)
    }


def reach(node: ast.AST, own: set[str], docstrings: set[int]) -> str | None:
    """Why ``node`` reaches into a library's internals, or None."""
    hooks = {hook.split(".")[1] for hook in compat.OVERRIDDEN_HOOKS}
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if module in ("src", "multigpu", "__future__") or module.startswith(("src.", "multigpu.")):
            return None
        if any(private(part) for part in module.split(".")) or any(private(alias.name) for alias in node.names):
            return "an import of a private name or module"
        if module in UNDOCUMENTED_MODULES or any(alias.name in UNDOCUMENTED_NAMES for alias in node.names):
            return "an import of an undocumented name or module"
    if isinstance(node, ast.Import) and any(private(p) for alias in node.names for p in alias.name.split(".")):
        return "an import of a private module"
    if isinstance(node, ast.Attribute) and private(node.attr):
        value = node.value
        from_super = isinstance(value, ast.Call) and ast.unparse(value.func) == "super"
        if from_super and node.attr in hooks:
            return None  # an overridden hook calling its base class's
        if not (on_self(value) and node.attr in own):
            return "a private attribute"
    if isinstance(node, ast.Attribute) and node.attr in LOOPS:
        return "the loops' classes are private"
    if isinstance(node, ast.Attribute) and node.attr in UNDOCUMENTED_ATTRIBUTES:
        return "an undocumented attribute"
    if isinstance(node, ast.Name) and node.id in UNDOCUMENTED_NAMES:
        return "an undocumented function"
    if isinstance(node, ast.Call):
        function = ast.unparse(node.func)
        strings = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        if function in ("getattr", "hasattr", "setattr", "delattr") and any(private(s) for s in strings):
            return "a private attribute by name"
        if function.endswith(".get") and any(private(s) for s in strings[:1]):
            return "a private key"
    key = node.slice.value if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) else None
    if isinstance(key, str) and (private(key) or key in UNDOCUMENTED_KEYS):
        return "a private key"
    text = node.value if isinstance(node, ast.Constant) and id(node) not in docstrings else None
    if isinstance(text, str) and PRIVATE_MODULE.search(text):
        return "a private module"
    return None


def reaches(source: str, own: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` of each reach into a library's internals in ``source``."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    found = []
    for node in ast.walk(tree):
        why = reach(node, own, docstrings)
        if why is not None:
            found.append((node.lineno, f"{ast.unparse(node).splitlines()[0][:100]} ({why})"))
    return sorted(found)


def scanned_files(folder: Path = REPO / "multigpu") -> list[Path]:
    """The engine's modules but the seam itself (``folder``: a project's, tests/examples/test_project.py)."""
    return [path for path in sorted(folder.rglob("*.py")) if not path.is_relative_to(REPO / "multigpu" / "compat")]


def private_reaches(files: list[Path]) -> list[str]:
    """``path:line: what`` of each reach into a library's internals in ``files`` (a name the engine's or their
    own classes define is theirs)."""
    sources = {path: path.read_text() for path in files}
    engine = [path.read_text() for path in scanned_files()]
    own = set().union(*(own_names(ast.parse(source)) for source in [*engine, *sources.values()]))
    return [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path, source in sources.items()
        for line, what in reaches(source, own)
    ]


def test_nothing_outside_compat_uses_a_private_name_of_a_library():
    files = scanned_files()
    assert len(files) > 20  # the walk found the package
    found = private_reaches(files)
    assert not found, "private names outside multigpu/compat/ (give each a function there):\n" + "\n".join(found)


def overridden_hooks(files: list[Path]) -> set[str]:
    """``Base._method`` of each protected method of a library base class that a class in ``files`` overrides."""
    overridden = set()
    for path in files:
        module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
            if not isinstance(cls, type):
                continue
            methods = [item.name for item in node.body if isinstance(item, ast.FunctionDef) and private(item.name)]
            libraries = [base for base in cls.__mro__[1:] if not base.__module__.startswith(("src.", "multigpu."))]
            overridden |= {f"{base.__name__}.{name}" for name in methods for base in libraries if name in vars(base)}
    return overridden


def test_the_protected_hooks_overridden_in_the_engine_are_the_ones_compat_lists():
    """A method of a class in ``multigpu/`` that overrides a protected method of a library base class is such a
    hook: ``OVERRIDDEN_HOOKS`` lists each, and a test above runs it (a project's: tests/examples/test_project.py)."""
    assert overridden_hooks(scanned_files()) == set(compat.OVERRIDDEN_HOOKS)


def test_the_scan_finds_each_kind_of_reach():
    source = r"""
from lightning.pytorch.loops.progress import _BatchProgress
from lightning.pytorch.utilities._pytree import tree_flatten
steps = trainer.fit_loop.epoch_loop.batch_progress
self._monitor_candidates(trainer)
hparams.get("_class_path")
pattern = r"lightning\.pytorch\.utilities\._pytree"
setattr(loop, "_broadcast_sigterm_tensor", stop)
from torch.nn.parallel.scatter_gather import scatter_kwargs
parser.callback_keys.remove("checkpoint")
params = StrategyRegistry[name]["init_params"]
"""
    assert {line for line, _ in reaches(source, own=set())} == set(range(2, 12))
    # plain Python on an object the engine holds: a method of its own on the instance, its own namespace, and
    # arithmetic on counters a compat function returned
    fine = """self._own = 1
self._own
type(first)._make(items)
super()._save_topk_checkpoint(trainer, c)
module.forward = other
del module.forward
vars(metric)
module.__dict__.get("forward")
setattr(plugin, "clip_grad_by_norm", clip)
progress.current.completed -= 1
"""
    assert reaches(fine, own={"_own"}) == []


# -- the training loaders -----------------------------------------------------------------------------------


class LoaderOfMine(DataLoader):
    """A DataLoader subclass with an argument of its own, given positionally."""

    def __init__(self, dataset, batch_size, tag="mine", **kwargs):
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.tag = tag


class LoadersOfMine(L.LightningDataModule):
    def train_dataloader(self):
        return LoaderOfMine(TensorDataset(torch.arange(12.0)), 4, "kept", shuffle=True, collate_fn=list)


class AskedLoaders(Callback):
    """Records, in ``setup``, the compat functions' view of the training loaders."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.source = compat.train_loader_source(trainer)
        self.loader = compat.request_train_loaders(trainer)
        self.uses_distributed_sampler = compat.uses_distributed_sampler(trainer)


def test_the_training_loaders_are_asked_of_the_data_module_and_rebuilt_with_the_users_class_and_arguments():
    data, asked = LoadersOfMine(), AskedLoaders()
    trainer(callbacks=[asked], use_distributed_sampler=False, limit_train_batches=0).fit(BoringModel(), data)
    assert asked.source is data and not asked.uses_distributed_sampler
    assert compat.uses_distributed_sampler(trainer())
    sampler = torch.utils.data.SequentialSampler(range(6))
    args, kwargs = compat.loader_arguments(asked.loader, sampler)
    assert args == () and (kwargs["batch_size"], kwargs["tag"], kwargs["sampler"]) == (4, "kept", sampler)
    kwargs.update(dataset=TensorDataset(torch.arange(6.0)), batch_size=2)
    remade = compat.remade_loader(asked.loader, **kwargs)
    assert isinstance(remade, LoaderOfMine) and remade.tag == "kept" and remade.collate_fn is list
    assert remade.sampler is sampler and remade.batch_size == 2 and len(remade.dataset) == 6
    assert [len(batch) for batch in remade] == [2, 2, 2]


def test_optimizer_count_reads_every_form_configure_optimizers_returns():
    from tests.zoo.gan import TinyGAN

    assert compat.optimizer_count(TinyGAN()) == 2  # a tuple of two optimizers
    assert compat.optimizer_count(BoringModel()) == 1  # an optimizer and a scheduler, as two lists

    class NeedsTheTrainer(BoringModel):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1 / self.trainer.estimated_stepping_batches)

    assert compat.optimizer_count(NeedsTheTrainer()) is None


class StatefulLoader(DataLoader):
    """A loader with a state of its own, which Lightning's fit loop saves with its own state."""

    loaded: list[dict[str, int]]

    def state_dict(self) -> dict[str, int]:
        return {"position": 3}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.loaded.append(state_dict)


class StatefulLoaderModel(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.loader = StatefulLoader(TensorDataset(torch.randn(8, 32)), batch_size=2)
        self.loader.loaded = []

    def train_dataloader(self) -> DataLoader:
        return self.loader

    def training_step(self, batch, batch_idx):
        return super().training_step(batch[0], batch_idx)


def test_the_saved_loader_states_are_dropped_before_lightning_restores_them(tmp_path):
    model = StatefulLoaderModel()
    trainer(max_steps=2).fit(model)
    path = tmp_path / "mid.ckpt"
    model.trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"position": 3}]
    compat.drop_saved_loader_states(checkpoint)
    assert "combined_loader" not in checkpoint["loops"]["fit_loop"]["state_dict"]

    class Dropping(Callback):
        def on_load_checkpoint(self, trainer, pl_module, checkpoint):
            compat.drop_saved_loader_states(checkpoint)

    resumed = StatefulLoaderModel()
    trainer(max_steps=3, callbacks=[Dropping()]).fit(resumed, ckpt_path=path)
    assert resumed.loader.loaded == []  # Lightning restored nothing: the state was taken out in time
    kept = StatefulLoaderModel()
    trainer(max_steps=3).fit(kept, ckpt_path=path)
    assert kept.loader.loaded == [{"position": 3}]  # without it, Lightning restores rank 0's


class CountingLoader(StatefulLoader):
    def __iter__(self):
        self.iterated += 1
        return super().__iter__()


class SchedulingModel(StatefulLoaderModel):
    def __init__(self) -> None:
        super().__init__()
        self.loader = CountingLoader(TensorDataset(torch.randn(8, 32)), batch_size=2)
        self.loader.loaded, self.loader.iterated = [], 0

    def configure_optimizers(self):
        self.steps = self.trainer.estimated_stepping_batches  # as a schedule reads it: the loaders requested
        return super().configure_optimizers()


def test_the_training_iterator_made_early_is_made_again():
    class Restarting(Callback):
        def on_train_start(self, trainer, pl_module):
            self.before = pl_module.loader.iterated  # made when the schedule read the steps
            compat.restart_training_iterator(trainer)
            self.after = pl_module.loader.iterated

    model, restarting = SchedulingModel(), Restarting()
    trainer(max_steps=2, callbacks=[restarting]).fit(model)
    assert model.steps == 2 and (restarting.before, restarting.after) == (1, 2)
    assert model.trainer.global_step == 2 and model.loader.iterated == 2  # trained from the iterator made again
