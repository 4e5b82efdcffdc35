"""The language model example: CausalLanguageModel (a byte-level GPT), TextDataModule and the embedded corpus,
its bad input, its throughput figures, and that it learns (that ddp trains it as one process does, and that a
stopped run resumes exactly: tests/examples/test_proofs.py; fsdp2 and tensor_parallel:
tests/examples/test_gpt_model_parallel.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from multigpu import hooks
from multigpu.errors import ConfigurationError
from multigpu.hooks import readers as hook_readers
from src.cli import main
from src.data import TextDataModule
from src.data.text import TokenWindows, decode, encode
from src.models import CausalLanguageModel
from tests import prewarmed
from tests.conftest import REPO, cli_env, read_metrics
from tests.errors.test_errors import fails_cleanly
from tests.examples.conftest import TINY_GPT
from tests.observe.test_throughput import logged

TINY_TEXT = [*TINY_GPT, "--data.init_args.corpus_chars=4000", "--trainer.max_steps=1", "--trainer.limit_val_batches=1"]


# -- the model -----------------------------------------------------------------------------------------------------


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = CausalLanguageModel(n_layer=2, n_head=2, n_embd=16, block_size=16).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)  # the past does not see the future
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_gpt_rejects_sequences_longer_than_its_block():
    model = CausalLanguageModel(n_layer=1, n_head=1, n_embd=8, block_size=8)
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_gpt_flops_follow_the_parameter_count():
    model = CausalLanguageModel(n_layer=2, n_head=2, n_embd=32, block_size=64)
    non_embedding = sum(p.numel() for p in model.parameters()) - 64 * 32
    assert model.flops_per_token() == 6 * non_embedding + 12 * 2 * 32 * 64


def test_gpt_generates_the_requested_number_of_tokens():
    model = CausalLanguageModel(n_layer=1, n_head=1, n_embd=8, block_size=8)
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), max_new_tokens=10, temperature=0)
    assert out.shape == (2, 13)


def test_gpt_has_the_pipeline_hooks_and_its_stages_say_their_blocks():
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)
    assert hook_readers.missing_pipeline_hooks(gpt) == []
    assert isinstance(gpt, hooks.Pipelined)
    assert hook_readers.stage_layer_count(gpt.pipeline_stage(0, 2)) == 1


def test_gpt_refuses_a_data_module_of_longer_sequences_in_one_paragraph():
    gpt = CausalLanguageModel(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    longer, fitting = SimpleNamespace(block_size=16), SimpleNamespace(block_size=8)
    with pytest.raises(ConfigurationError, match=r"block_size=16 is longer than the model.s .*block_size=8"):
        hook_readers.check_datamodule(gpt, longer)
    hook_readers.check_datamodule(gpt, fitting)  # nothing raised


def test_help_lists_the_language_models_options(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "src.models.CausalLanguageModel"])
    out = capsys.readouterr().out
    assert "--model.n_layer" in out and "--model.optimizer" in out and "Optimizer class and options" in out


# -- the data ------------------------------------------------------------------------------------------------------


def test_text_round_trips_through_byte_tokens():
    text = "héllo, wörld ✓"
    assert decode(encode(text)) == text
    assert int(encode(text).max()) < 256


def test_token_windows_shift_targets_by_one():
    windows = TokenWindows(torch.arange(50, dtype=torch.uint8), block_size=8)
    assert len(windows) == 6
    x, y = windows[1]
    assert x.tolist() == list(range(8, 16)) and y.tolist() == list(range(9, 17))


def test_text_module_reads_a_file_and_holds_out_its_end(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("abcdefghij" * 500)
    dm = TextDataModule(path=str(path), block_size=16, val_fraction=0.2, batch_size=4)
    dm.prepare_data()
    dm.setup()
    assert len(dm.train_set) == (4000 - 1) // 16
    # the last 20% (1000 bytes) is held out: 500 for validation, then 500 for test, in windows of 16 + 1
    assert len(dm.val_set) == len(dm.test_set) == (500 - 1) // 16
    text = path.read_bytes()
    assert bytes(dm.val_set[0][0].tolist()) == text[4000:4016] and bytes(dm.test_set[0][1].tolist()) == text[4501:4517]
    with pytest.raises(ConfigurationError, match=r"--data.init_args.path=.*missing.txt is not a file"):
        TextDataModule(path=str(tmp_path / "missing.txt")).prepare_data()


# -- bad input -----------------------------------------------------------------------------------------------------


def test_gpt_shape_mistakes(capsys, tmp_path):
    args = ["fit", *TINY_TEXT, f"--trainer.default_root_dir={tmp_path}"]
    fails_cleanly(
        capsys,
        [*args, "--model.init_args.n_embd=31"],
        "--model=src.models.CausalLanguageModel",
        "n_embd=31 must be a multiple of n_head=2",
    )
    fails_cleanly(capsys, [*args, "--data.init_args.block_size=64"], "--data.init_args.block_size=64", "block_size=32")
    assert not list(tmp_path.rglob("*"))


def text_file(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    return path


def test_text_data_mistakes(tmp_path, capsys):
    def fails(*args: str, needles: tuple[str, ...]) -> None:
        fails_cleanly(capsys, ["fit", *TINY_TEXT, f"--trainer.default_root_dir={tmp_path / 'run'}", *args], *needles)

    fails("--data.init_args.path=" + str(tmp_path / "none.txt"), needles=("none.txt", "is not a file"))
    empty = text_file(tmp_path, b"")
    fails(f"--data.init_args.path={empty}", needles=("is empty", "Fix:"))
    short = text_file(tmp_path, b"A short text. " * 5)
    fails(f"--data.init_args.path={short}", needles=("--data.init_args.block_size=32", "longer than"))
    latin1 = text_file(tmp_path, "caf\xe9 ".encode("latin-1") * 200)
    fails(f"--data.init_args.path={latin1}", needles=("not UTF-8", "iconv"))
    fails("--data.init_args.val_fraction=1.5", needles=("--data.init_args.val_fraction=1.5",))
    fails("--data.init_args.corpus_chars=0", needles=("--data.init_args.corpus_chars=0", "empty"))
    assert not list(tmp_path.rglob("*.ckpt"))


# -- throughput ----------------------------------------------------------------------------------------------------


def test_language_model_logs_tokens_and_its_own_flop_count(tmp_path):
    run_dir = tmp_path / "run"
    main([
        "fit", *TINY_GPT, "--trainer.max_steps=6", "--trainer.log_every_n_steps=3", "--trainer.limit_val_batches=1",
        "--progress_bar=none", f"--trainer.default_root_dir={run_dir}",
    ])  # fmt: skip
    rows = read_metrics(run_dir)
    samples, tokens = logged(rows, "perf/samples_per_s"), logged(rows, "perf/tokens_per_s")
    assert len(samples) == 2 and tokens == pytest.approx([32 * s for s in samples], rel=1e-5)  # block_size 32
    # written straight to the logger, at the step Lightning gives the loss logged on the same optimizer step (if a
    # Lightning release counts its logging steps differently, multigpu.compat.logging_step must follow)
    assert [row["step"] for row in rows if row.get("perf/samples_per_s")] == ["2", "5"]
    assert [row["step"] for row in rows if row.get("train/loss")] == ["2", "5"]
    model = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]
    assert model["block_size"] == 32
    flops = logged(rows, "perf/tflops_per_device")
    assert all(f > 0 for f in flops)
    assert "perf/mfu" not in rows[0]  # a CPU has no known peak unless one is given


# -- training ------------------------------------------------------------------------------------------------------


GPT = [
    "--config", "configs/experiment/gpt.yaml", "--trainer.accelerator=cpu", "--progress_bar=none",
    "--model.init_args.n_layer=2", "--model.init_args.n_embd=64", "--model.init_args.block_size=64",
    "--data.init_args.block_size=64", "--data.init_args.corpus_chars=120000",
    "--trainer.max_steps=60", "--model.init_args.lr_scheduler.init_args.T_max=60", "--trainer.val_check_interval=20",
    "--data.init_args.batch_size=16",
]  # fmt: skip


@pytest.mark.slow
def test_language_model_validation_loss_falls_well_below_its_start(tmp_path):
    run_dir = tmp_path / "gpt"
    main(["validate", *GPT, f"--trainer.default_root_dir={run_dir}"])  # the untrained model
    start = float(read_metrics(run_dir, version=0)[-1]["val/loss"])
    main(["fit", *GPT, f"--trainer.default_root_dir={run_dir}"])
    losses = [float(r["val/loss"]) for r in read_metrics(run_dir, version=1) if r.get("val/loss")]
    assert len(losses) == 3
    assert start > 5.0  # ~ln(256): untrained byte predictions are near uniform
    assert losses[-1] < 0.5 * start and losses[-1] < losses[0]


def test_naming_an_example_imports_its_module_and_only_that_one():
    """``src.models`` and ``src.data`` import an example when it is named (``--model=src.models.GPT``)."""
    probe = "import sys, src.models, src.data; src.models.GPT; src.data.TextDataModule; print(sorted(sys.modules))"
    named = prewarmed.run([sys.executable, "-c", probe], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert named.returncode == 0, named.stderr[-2000:]
    assert "'src.models.gpt'" in named.stdout and "'src.data.text'" in named.stdout
    assert "'src.models.image_classifier'" not in named.stdout and "'src.data.images'" not in named.stdout
