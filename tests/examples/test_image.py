"""The image example: ImageClassifier (CompactResNet), CIFAR10DataModule (CIFAR-10 files, the synthetic set,
augmentation), the default run of configs/default.yaml, its bad input, and its training under ddp, compiled."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from multigpu.errors import ConfigurationError
from src.cli import DEFAULT_CONFIG, main
from src.data import CIFAR10DataModule
from src.data.images import (
    CIFAR10_FOLDER,
    download_cifar10,
    find_cifar10_folder,
    random_crop_flip,
    synthetic_images,
)
from src.models import ImageClassifier
from tests.conftest import cli_env, finished_run, last_value, load_state, read_metrics, relative_difference, unchanged
from tests.errors.test_errors import fails_cleanly
from tests.examples.conftest import TINY_IMAGE, write_cifar10

TINY_IMAGE_RUN = [*TINY_IMAGE, "--trainer.limit_val_batches=1"]


# -- the model -----------------------------------------------------------------------------------------------------


def test_image_classifier_outputs_logits_per_class():
    model = ImageClassifier(num_classes=7, widths=(8, 16))
    assert model(torch.randn(5, 3, 32, 32)).shape == (5, 7)


# -- the data ------------------------------------------------------------------------------------------------------


def test_synthetic_images_are_deterministic_balanced_cifar_shaped():
    a, b = synthetic_images(200, seed=3), synthetic_images(200, seed=3)
    assert a.images.shape == (200, 3, 32, 32) and a.images.dtype == torch.uint8
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert torch.bincount(a.labels, minlength=10).tolist() == [20] * 10
    assert not torch.equal(a.images, synthetic_images(200, seed=4).images)


def test_augmentation_depends_only_on_seed_epoch_and_sample_index():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    index = torch.arange(100, 116)
    out = random_crop_flip(images, index, seed=1, epoch=0)
    assert out.shape == images.shape
    # the same sample gets the same crop whatever batch (process, worker) it arrives in
    assert torch.equal(random_crop_flip(images[5:9], index[5:9], seed=1, epoch=0), out[5:9])
    assert not torch.equal(random_crop_flip(images, index, seed=1, epoch=1), out)
    # every output is a crop of the zero-padded image, mirrored or not
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    for i in range(16):
        crops = [
            view[:, dy : dy + 32, dx : dx + 32]
            for view in (padded[i], padded[i].flip(-1))
            for dy in range(9)
            for dx in range(9)
        ]
        assert any(torch.equal(crop, out[i]) for crop in crops)
    assert (out != images).flatten(1).any(1).float().mean() > 0.5  # most samples are actually changed


def test_cifar10_batches_are_read_and_split(tmp_path):
    write_cifar10(tmp_path)
    dm = CIFAR10DataModule(data_dir=str(tmp_path), val_size=30, batch_size=10)
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.train_set) == 70 and len(dm.val_set) == 30 and len(dm.test_set) == 20
    image, label, _ = dm.train_set[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.uint8 and 0 <= int(label) < 10
    # the folder may also be given as the batch folder itself
    assert find_cifar10_folder(tmp_path / CIFAR10_FOLDER) == tmp_path / CIFAR10_FOLDER


def test_missing_cifar10_folder_names_the_option_and_the_fixes(tmp_path):
    dm = CIFAR10DataModule(data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigurationError, match=r"--data.init_args.data_dir=.*nowhere.*download=true.*synthetic"):
        dm.prepare_data()


def test_download_checks_the_archive_and_unpacks_it(tmp_path):
    source = tmp_path / "source"
    write_cifar10(source)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / CIFAR10_FOLDER, arcname=CIFAR10_FOLDER)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    folder = download_cifar10(tmp_path / "data", url=archive.as_uri(), md5=md5)
    assert folder == tmp_path / "data" / CIFAR10_FOLDER
    with pytest.raises(ConfigurationError, match="MD5"):
        download_cifar10(tmp_path / "bad", url=archive.as_uri(), md5="0" * 32)


def test_train_loader_outside_a_trainer_uses_the_whole_global_batch():
    dm = CIFAR10DataModule(synthetic_train_size=256, synthetic_val_size=64, batch_size=32)
    dm.setup()
    loader = dm.train_dataloader()
    images, _, _ = next(iter(loader))
    assert images.shape[0] == 32 and len(loader) == 8


# -- the default run -----------------------------------------------------------------------------------------------


def default_model() -> str | None:
    model = (yaml.safe_load(DEFAULT_CONFIG.read_text()) or {}).get("model") or {}
    return model.get("class_path") if isinstance(model, dict) else model


@pytest.mark.slow
@pytest.mark.skipif(
    default_model() != "src.models.ImageClassifier",
    reason="configs/default.yaml names another model: a bare fit trains that one, not the image example",
)
@pytest.mark.extended
def test_bare_fit_trains_the_embedded_default_and_writes_checkpoint_and_metrics(tmp_path, run_cli):
    """`python -m src.cli fit` with nothing else: the README's first command."""
    result = run_cli("fit", cwd=tmp_path, env=cli_env(), timeout=900, fresh=True)  # the README's command, as typed
    run_dir = tmp_path / "runs" / "default"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert list((run_dir / "checkpoints").glob("best-*.ckpt"))
    assert (run_dir / "logs" / "version_0" / "config.yaml").is_file()
    rows = read_metrics(run_dir)
    # untrained weights score ~0.10 on the 10 balanced classes; two short epochs reach far above that
    assert last_value(rows, "val/acc") > 0.35
    assert last_value(rows, "val/loss") < 2.0
    assert "done  epoch" in result.stdout  # plain progress lines when stdout is not a terminal


@pytest.mark.slow
@pytest.mark.extended
def test_ddp_trains_the_image_model_as_one_process_and_compiled_recompiles_nothing(run_cli, tmp_path):
    """GroupNorm, not BatchNorm: splitting the batch over two processes changes nothing (fp64; eager, with the
    engine's helpers: tests/examples/test_proofs.py), nor does compiling it. The ddp run compiles the forward
    (``--compile=true``, inductor), not the step: Lightning runs a ddp step through the wrapped module's call, and
    were that compiled, dynamo would trace the step, break its graph in the torchmetrics updates and recompile them
    on each update until torch's limit. Nothing breaks or recompiles over training, a validation
    and training again; the compiled model trains the eager one's and saves the eager one's keys."""
    common = [*TINY_IMAGE, "--trainer.max_steps=24", "--trainer.precision=64-true", "--progress_bar=none"]
    main(["fit", *common, "--trainer.devices=1", f"--trainer.default_root_dir={tmp_path / 'single'}"])
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--compile=true"]
    env = cli_env(TORCH_LOGS="graph_breaks")
    result = run_cli("fit", *common, *ddp, f"--trainer.default_root_dir={tmp_path / 'ddp'}", env=env)
    assert "compiling ImageClassifier.forward with torch.compile (backend inductor)" in result.stderr
    assert "recompile" not in result.stderr.lower() and "Graph break" not in result.stderr
    single, spread = (load_state(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("single", "ddp"))
    assert list(spread) == list(single) and not any("_orig_mod" in key for key in spread)
    assert torch.load(tmp_path / "ddp" / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 24
    assert relative_difference(single, spread) < 1e-10
    for key in ("val/loss", "val/acc"):  # torchmetrics accumulates in fp32
        expected = last_value(read_metrics(tmp_path / "single"), key)
        assert last_value(read_metrics(tmp_path / "ddp"), key) == pytest.approx(expected, rel=1e-6)
    # a validation between training steps: the compiled forward went from training to evaluation and back
    assert [row["step"] for row in read_metrics(tmp_path / "ddp") if row.get("val/loss")][:1] == ["15"]


# -- bad input -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_run(tmp_path_factory) -> Path:
    """A finished two-step run of the tiny image workload: checkpoints, logs and config."""
    return finished_run(main, "src.cli", TINY_IMAGE_RUN, tmp_path_factory.mktemp("errors") / "run")


@pytest.fixture
def untouched(image_run):
    """The image run's directory; the test fails if any of its files changed."""
    with unchanged(image_run):
        yield image_run


def resume(run_dir: Path, *args: str) -> list[str]:
    return ["fit", *TINY_IMAGE_RUN, f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *args]


def test_image_data_mistakes(tmp_path, capsys, untouched):
    fails_cleanly(
        capsys,
        resume(untouched, f"--data.init_args.data_dir={tmp_path / 'no_such_folder'}"),
        "--data.init_args.data_dir=",
        "no CIFAR-10 batches",
    )
    fails_cleanly(capsys, resume(untouched, "--data.init_args.synthetic_train_size=0"), "synthetic_train_size=0")
    write_cifar10(tmp_path / "cifar", per_file=8)  # 40 training images
    fails_cleanly(
        capsys,
        resume(untouched, f"--data.init_args.data_dir={tmp_path / 'cifar'}", "--data.init_args.val_size=5000"),
        "--data.init_args.val_size=5000",
        "40 images",
    )
