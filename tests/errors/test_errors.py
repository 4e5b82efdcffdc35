"""Bad input: one paragraph naming the option and the fix, exit status 2, no traceback, the run directory untouched.

Every mistake runs in-process against an existing run directory (a real tiny run, resumed with ``--ckpt_path=last``
where the mistake allows it) whose files are hashed before and after. An error in the user's own code keeps its
traceback. A few multi-process ones run ``ddp`` on two CPU processes: a configuration error is reported once, and
every process exits promptly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import tests.cli
from multigpu.errors import DEBUG_ENV, ConfigurationError
from tests import prewarmed
from tests.cli import DEFAULT_CONFIG, main
from tests.conftest import REPO, TINY_RUN, cli_env


def assert_one_paragraph(err: str, *needles: str) -> None:
    assert err.startswith("error: "), err
    assert "Traceback" not in err, err
    assert "Fix" in err, err
    assert len(err.strip().splitlines()) <= 3, err  # the message, and at most jsonargparse's own Fix line
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err}"


def fails_cleanly(capsys, args: list[str], *needles: str) -> str:
    """Run the CLI in-process; expect exit status 2 and one paragraph containing every needle."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    # Lightning's own info lines (seed, GPU available) may precede the error
    err = err[err.index("error: ") :] if "error: " in err else err
    assert_one_paragraph(err, *needles)
    return err


def resume(run_dir: Path, *args: str) -> list[str]:
    return ["fit", *TINY_RUN, f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *args]


# -- the command line and config files -------------------------------------------------------------------------

PARSER_MISTAKES = {
    "unknown option": (["--trainer.max_epochz=3"], ["--trainer.max_epochz"]),
    "abbreviated option": (["--trainer.max_epoch=3"], ["unrecognized arguments: --trainer.max_epoch=3"]),
    "wrong type": (["--trainer.max_epochs=abc"], ["trainer.max_epochs", "abc"]),
    "unknown model argument": (["--model.init_args.widthz=3"], ["widthz", "not accepted"]),
    "unknown model class": (["--model=tests.fixtures.NoSuchModel"], ["tests.fixtures.NoSuchModel"]),
    "invalid precision": (["--trainer.precision=17"], ["trainer.precision", "17"]),
    "unknown strategy": (["--trainer.strategy=ddq"], ["--trainer.strategy=ddq", "not a known strategy"]),
    "zero devices": (["--trainer.devices=0"], ["--trainer.devices must be at least 1"]),
    "too many devices": (["--trainer.devices=100000"], ["--trainer.devices=100000", "more CPU cores"]),
    "gpu on a cpu machine": (["--trainer.accelerator=gpu"], ["--trainer.accelerator", "no CUDA GPU"]),
    "batch not divisible by processes": (
        ["--trainer.strategy=ddp", "--trainer.devices=2", "--data.init_args.batch_size=33"],
        ["--data.batch_size=33", "multiple of 2"],
    ),
    "batch not divisible by accumulation": (
        ["--trainer.accumulate_grad_batches=3", "--data.init_args.batch_size=32"],
        ["multiple of 3"],
    ),
}


@pytest.mark.parametrize("mistake", PARSER_MISTAKES)
def test_command_line_mistakes(mistake, capsys, untouched):
    args, needles = PARSER_MISTAKES[mistake]
    if mistake == "gpu on a cpu machine" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    fails_cleanly(capsys, resume(untouched, *args), *needles)


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys, untouched):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: 5\n  devices: [1\n")
    fails_cleanly(capsys, resume(untouched, "--config", str(bad)), f"--config {bad}", "line 4", "YAML")


def test_missing_config_file(tmp_path, capsys, untouched):
    fails_cleanly(capsys, resume(untouched, "--config", str(tmp_path / "nope.yaml")), "nope.yaml")


def test_bad_value_in_an_environment_variable(capsys, monkeypatch, untouched):
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_STEPS", "many")
    fails_cleanly(capsys, resume(untouched), "max_steps", "many")


def test_an_unknown_key_in_the_default_config(tmp_path, capsys, monkeypatch, untouched):
    default = tmp_path / "default.yaml"
    default.write_text(DEFAULT_CONFIG.read_text().replace("  max_epochs: 2", "  max_epoch: 2"))
    monkeypatch.setattr(tests.cli.CLI, "default_config", default)
    # the tests' classes replace the default config's: the template gives the parser the file, less their sections
    fails_cleanly(capsys, resume(untouched), str(default), "trainer.max_epoch")
    fails_cleanly(capsys, ["fit", "--print_config"], "max_epoch")  # its own classes: the parser reads the file


def test_run_directory_that_is_a_file(tmp_path, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("precious")
    fails_cleanly(capsys, ["fit", *TINY_RUN, f"--trainer.default_root_dir={blocker}/run"], "is a file", "Fix:")
    assert blocker.read_text() == "precious"


# -- building the objects --------------------------------------------------------------------------------------

BUILD_MISTAKES = {
    "model constructor": (
        ["--model.init_args.hidden=-1"],
        ["--model=tests.fixtures.workload.TinyClassifier", "negative dimension -1"],
    ),
    "trainer constructor": (
        ["--trainer.limit_train_batches=-1"],
        ["building the Trainer from the --trainer options", "limit_train_batches"],
    ),
    "callback constructor": (["--checkpoint.every_n_train_steps=-1"], ["callbacks", "every_n_train_steps=-1"]),
    "negative learning rate": (
        ["--model.init_args.optimizer.init_args.lr=-0.1"],
        ["--model.init_args.optimizer", "Invalid learning rate: -0.1"],
    ),
    "negative weight decay": (
        ["--model.init_args.optimizer.init_args.weight_decay=-1"],
        ["--model.init_args.optimizer", "weight_decay"],
    ),
    "scheduler": (
        [
            "--model.init_args.lr_scheduler=torch.optim.lr_scheduler.OneCycleLR",
            "--model.init_args.lr_scheduler.init_args.max_lr=0.1",
            "--model.init_args.lr_scheduler.init_args.total_steps=0",
        ],
        ["--model.init_args.lr_scheduler", "total_steps"],
    ),
}


@pytest.mark.parametrize("mistake", BUILD_MISTAKES)
def test_object_building_mistakes(mistake, capsys, tmp_path, untouched):
    args, needles = BUILD_MISTAKES[mistake]
    if not args[0].startswith("--model"):
        fails_cleanly(capsys, resume(untouched, *args), *needles)
        return
    # a fresh run beside the existing one: a --model flag would first be compared with the checkpoint's
    fails_cleanly(capsys, ["fit", *TINY_RUN, f"--trainer.default_root_dir={tmp_path / 'run'}", *args], *needles)
    assert not list(tmp_path.rglob("*"))  # nothing written


USER_MODULE = textwrap.dedent(
    '''
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Ratios(L.LightningDataModule):
        """Any user data module: an exception its own code raises keeps its traceback."""

        def __init__(self, denominator: float = 1.0):
            super().__init__()
            self.denominator = denominator

        def setup(self, stage):
            self.data = TensorDataset(torch.ones(8, 1) / self.denominator, torch.ones(8, 1))
            if self.denominator == 0:
                raise ZeroDivisionError("denominator must not be 0")

        def train_dataloader(self):
            return DataLoader(self.data, batch_size=4)


    class Line(L.LightningModule):
        def __init__(self, fail_in_training_step: bool = False):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.fail_in_training_step = fail_in_training_step

        def training_step(self, batch, batch_idx):
            if self.fail_in_training_step:
                raise RuntimeError("a bug in the training code")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    package = tmp_path / "user_code"
    package.mkdir()
    (package / "__init__.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield ["--model=user_code.Line", "--data=user_code.Ratios", "--trainer.accelerator=cpu", "--trainer.max_steps=1"]
    sys.modules.pop("user_code", None)


def test_an_exception_of_the_users_own_code_keeps_its_traceback(tmp_path, user_module):
    """Whether in setup or in training_step: the code that raised it is the place to look, not an option."""
    for failing, error in (
        ("--data.init_args.denominator=0", ZeroDivisionError),
        ("--model.init_args.fail_in_training_step=true", RuntimeError),
    ):
        with pytest.raises(error):
            main(["fit", *user_module, f"--trainer.default_root_dir={tmp_path}", failing])


def test_an_exception_of_a_data_modules_own_loader_code_is_headed_by_where_it_came_from(tmp_path, capsys):
    args = ["fit", "--model=tests.zoo.loaders.DropoutClassifier", "--data=tests.zoo.loaders.MissingSplit"]
    with pytest.raises(KeyError, match="no split named"):
        main([*args, "--trainer.accelerator=cpu", f"--trainer.default_root_dir={tmp_path}"])
    heading = "error in MissingSplit.train_dataloader(), the data module's own code; its traceback follows."
    assert heading in capsys.readouterr().err


def test_debug_switch_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "true")
    args = ["fit", *TINY_RUN, f"--trainer.default_root_dir={tmp_path}", "--data.init_args.val_size=0"]
    with pytest.raises(ConfigurationError, match="val_size=0"):
        main(args)


# -- several processes: reported once, nobody hangs --------------------------------------------------------------

DDP_CPU = ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.devices=2"]


def run_cli(*args: str, timeout: int = 90, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI in its own process group; on a hang, kill every rank (not only the first) and fail."""
    start = time.monotonic()
    process = prewarmed.popen(
        [sys.executable, "-m", "tests.cli", *args],
        cwd=REPO,
        env=cli_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"hung for {timeout} s: {' '.join(args)}\n{stderr[-4000:]}")
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return result, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mistake", "needle"),
    [
        ("--data.init_args.data_dir=/no/such/folder", "--data.init_args.data_dir=/no/such/folder"),  # rank 0 only
        ("--data.init_args.val_size=0", "--data.init_args.val_size=0"),  # every rank, in setup
    ],
)
def test_ddp_configuration_error_is_reported_once_without_a_gloo_traceback(tmp_path, mistake, needle):
    args = ["fit", *TINY_RUN, *DDP_CPU, f"--trainer.default_root_dir={tmp_path}", *mistake.split()]
    result, seconds = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error: ") == 1, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr and "Connection" not in result.stderr, result.stderr
    assert seconds < 60


@pytest.mark.slow
def test_a_configuration_error_only_rank_1_meets_is_printed_once_by_rank_0_with_its_exit_status(tmp_path):
    """Rank 1 hands its paragraph to rank 0, which prints it, stops the ranks and exits with rank 1's status, instead
    of the connection rank 0 lost in its all-reduce."""
    failing = ["--model=tests.zoo.stuck.FailingClassifier", "--model.init_args.configuration_error=true"]
    result, _ = run_cli("fit", *TINY_RUN, *DDP_CPU, f"--trainer.default_root_dir={tmp_path}", *failing)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("error: ") == 1, result.stderr[-3000:]
    assert "error: (rank 1) rank 1's shard is empty. Fix: give every rank samples." in result.stderr
    assert "Traceback" not in result.stderr and "Connection" not in result.stderr, result.stderr[-3000:]


# -- nothing a run writes holds a secret from the environment ---------------------------------------------------

FAKE_SECRETS = {
    "WANDB_API_KEY": "fakewandbkey0123456789abcdef0123456789abcd",
    "HF_TOKEN": "hf_fakehuggingfacetoken31415",
    "AWS_SECRET_ACCESS_KEY": "fakeawssecretaccesskey27182",
    "MY_SERVICE_PASSWORD": "fakeservicepassword16180",
    "GITHUB_TOKEN": "ghp_fakegithubtoken14142",
}


@pytest.mark.slow
def test_no_environment_secret_reaches_any_file_a_run_writes(tmp_path):
    """Fake tokens in the environment; the wandb (offline) logger and an env-var config; grep every file."""
    run_dir = tmp_path / "run"
    result, _ = run_cli(
        "fit",
        *TINY_RUN,
        "--config",
        "configs/logger/wandb.yaml",
        "--data.init_args.train_size=128",
        f"--trainer.default_root_dir={run_dir}",
        PL_FIT__TRAINER__MAX_STEPS="2",
        PL_FIT__MODEL="{class_path: tests.fixtures.workload.TinyClassifier, init_args: {hidden: 8}}",
        **FAKE_SECRETS,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written) and (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert any(p.name == "config.yaml" for p in written)
    outputs = [("stdout", result.stdout.encode()), ("stderr", result.stderr.encode())]
    for name, content in [*((str(p), p.read_bytes()) for p in written), *outputs]:
        for variable, secret in FAKE_SECRETS.items():
            assert secret.encode() not in content, f"{variable} leaked into {name}"
