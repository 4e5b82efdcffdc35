"""``copier copy`` of this repository (copier.yml, template/): a project per workload, small, with no reference to
anything it lacks, whose files from this repository are this repository's bytes, and whose README commands work.

The projects are generated once per session (conftest.py); the tests that run commands in them are ``slow``, and
of those only the stub's runs its whole test suite (the project users start from)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

import multigpu
from tests.template.conftest import REPO, WORKLOADS, copier, env, generate, git, run
from tests.workflows.test_slurm import Jobs, slurm  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.xdist_group("template"), pytest.mark.extended]  # one worker generates the projects once

#: the README's two commands, as a user copies them
README_COMMANDS = (
    "python3 -m venv .venv && . .venv/bin/activate && (nvidia-smi -L >/dev/null 2>&1 || pip install torch"
    ' --index-url https://download.pytorch.org/whl/cpu) \\\n    && pip install -e ".[dev]" && python -m src.cli fit',
    "python -m pytest",
)
#: a project's own files, made for it; every other file of a project that this repository also has is its bytes
OWN = {
    ".copier-answers.yml",
    ".github/workflows/ci.yml",
    ".gitignore",
    "README.md",
    "configs/default.yaml",
    "configs/logger/wandb.yaml",  # the project's wandb project
    "pyproject.toml",
    "src/__init__.py",
    "src/data/__init__.py",
    "src/models/__init__.py",
    "tests/conftest.py",
}
#: the sbatch scripts whose default config is the image example's here (``${CONFIG-...}``): the workload's there
WORKLOAD_CONFIG = {"slurm/gpu.sbatch", "slurm/multi_node.sbatch"}
DEFAULT_CONFIG = {"stub": "${CONFIG-}", "gpt": "${CONFIG-configs/experiment/gpt.yaml}"}
#: what every project shares with this repository, and what each workload adds
SHARED = [
    ".pre-commit-config.yaml", "src/cli.py", "src/consolidate.py", "slurm/common.sh", "slurm/cpu.sbatch",
    "slurm/array.sbatch", "slurm/sweep.sbatch", "configs/logger/csv.yaml", "configs/logger/tensorboard.yaml",
    *(f"configs/{p.parent.name}/{p.name}" for f in ("trainer", "precision") for p in (REPO / "configs" / f).glob("*")),
]  # fmt: skip
EXAMPLE_FILES = {
    "stub": [],
    "image": [
        "src/models/image_classifier.py", "src/data/images.py", "configs/experiment/image.yaml",
        "configs/experiment/image_synthetic.yaml", "configs/sweep/quick.yaml", *WORKLOAD_CONFIG,
    ],
    "gpt": ["src/models/gpt.py", "src/data/text.py", "src/data/corpus.py", "configs/experiment/gpt.yaml"],
}  # fmt: skip
#: what the stub project never names: the examples' classes, data, files and layers (its model has no GroupNorm)
EXAMPLE_NAMES = re.compile(
    r"ImageClassifier|CompactResNet|CIFAR|CausalLanguageModel|TextDataModule|\bGPT\b|\bgpt\b|image_classifier"
    r"|images\.py|text\.py|corpus|configs/experiment|GroupNorm|LayerNorm"
)
#: a path the project names: a folder of its own (or of the engine) and what follows, also after $REPO/ in scripts
PATH = re.compile(
    r"(?:(?<=\$REPO/)|(?<![\w./~$-]))((?:src|configs|slurm|tests|docs|scripts|benchmarks|multigpu|template)/[\w./*-]*)"
)
MODULE = re.compile(r"-m\s+((?:src|multigpu)(?:\.\w+)+)")
DOTTED = re.compile(r"\bsrc(?:\.\w+)+")
OPTION = re.compile(r"--((?:trainer|model|data|checkpoint|preemption|pipeline|nan_guard|run_plan)(?:\.\w+)+)")
SECTION = re.compile(r'README "([^"]+)"')


def files(root: Path) -> dict[str, Path]:
    """The project's files by relative path, without what runs and tools leave behind."""
    left = {"runs", ".git", ".pytest_cache", ".ruff_cache", "__pycache__"}
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and not left & set(p.relative_to(root).parts)
    }


def defines(root: Path, dotted: str) -> bool:
    """Whether ``src.a.b.Name`` (or the module ``src.a.b``) exists in the project: the longest module prefix is a
    file of it, and the rest is a name its top level defines or imports."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[cut:]
            if not rest:
                return True
            names = set()
            for node in ast.parse(source.read_text()).body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update(alias.asname or alias.name for alias in node.names)
                elif isinstance(node, ast.Assign):
                    names.update(target.id for target in node.targets if isinstance(target, ast.Name))
            return len(rest) == 1 and rest[0] in names
    return False


def path_exists(root: Path, reference: str) -> bool:
    """A folder or file (or glob) of the project, or of the engine for ``multigpu/``."""
    base = REPO if reference.startswith("multigpu/") else root
    reference = reference.rstrip(".")
    return any(base.glob(reference.rstrip("/"))) if "*" in reference else (base / reference).exists()


def dangling(root: Path) -> list[str]:
    """Every path, module, class path and README section the project's files name that it does not have."""
    headings = {line.lstrip("#").strip() for line in (root / "README.md").read_text().splitlines() if line[:1] == "#"}
    found = []
    for name, path in files(root).items():
        text = path.read_text()
        found += [f"{name}: path {r}" for r in PATH.findall(text) if not path_exists(root, r)]
        for module in MODULE.findall(text):
            there = defines(root, module) if module.startswith("src.") else find_spec(module) is not None
            found += [] if there else [f"{name}: module {module}"]
        found += [f"{name}: {d}" for d in DOTTED.findall(text) if not defines(root, d)]
        found += [f"{name}: README section {s!r}" for s in SECTION.findall(text) if s not in headings]
    return found


def option_keys(root: Path) -> set[str]:
    """Every option of ``python -m src.cli fit`` in the project, from its resolved config (without ``init_args``)."""
    config = yaml.safe_load(run(sys.executable, "-m", "src.cli", "fit", "--print_config", cwd=root).stdout)
    keys: set[str] = set()

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                name = prefix if key in ("init_args", "class_path") else f"{prefix}.{key}".lstrip(".")
                keys.add(name)
                walk(value, name)

    walk(config, "")
    return keys


@pytest.mark.parametrize("workload", WORKLOADS)
def test_everything_a_project_names_it_has(projects: dict[str, Path], workload: str) -> None:
    root = projects[workload]
    assert dangling(root) == []  # `python -m multigpu.docs` among the modules: the engine's documentation


def test_the_stub_project_is_small_and_names_no_example(projects: dict[str, Path]) -> None:
    root = projects["stub"]
    counts = {name: len(path.read_text().splitlines()) for name, path in files(root).items()}
    assert sum(counts.values()) <= 1000, counts
    named = [f"{name}: {m.group()}" for name, p in files(root).items() for m in EXAMPLE_NAMES.finditer(p.read_text())]
    assert named == []
    assert {"src/models/model.py", "src/data/data.py", "configs/sweep/model.yaml"} <= set(counts)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_the_files_from_this_repository_are_its_bytes(projects: dict[str, Path], workload: str) -> None:
    generated = files(projects[workload])
    assert set(SHARED + EXAMPLE_FILES[workload]) <= set(generated), "a file from this repository is missing"
    differ = []
    for name, path in generated.items():
        if name in OWN or not (REPO / name).is_file():
            continue
        text = path.read_text()
        if name in WORKLOAD_CONFIG and workload != "image":  # the workload's default config, else the same
            assert DEFAULT_CONFIG[workload] in text, name
            text = text.replace(DEFAULT_CONFIG[workload], "${CONFIG-configs/experiment/image.yaml}")
        if text != (REPO / name).read_text():
            differ.append(name)
    assert differ == []
    assert (projects[workload] / "src" / "cli.py").read_bytes() == (REPO / "src" / "cli.py").read_bytes()


def test_the_answers_reach_the_sbatch_lines_the_logger_and_the_engine_source(template_repo: Path, tmp_path) -> None:
    answers = ["slurm_partition=a100", "slurm_account=proj42", "gpus_per_node=8", "logger=wandb",
               "wandb_project=vision", "engine_source=index", "description=Faces, \"quoted\""]  # fmt: skip
    root = generate(template_repo, tmp_path / "custom", *answers)
    gpu = (root / "slurm" / "gpu.sbatch").read_text()
    for line in ["--partition=a100", "--account=proj42", "--gres=gpu:8", "--ntasks-per-node=8"]:
        assert re.search(rf"^#SBATCH {line} +# ", gpu, re.MULTILINE), line
    assert "--gres=gpu:1 " in (root / "slurm" / "array.sbatch").read_text()  # one GPU per run stays one
    assert "--account=proj42" in (root / "slurm" / "cpu.sbatch").read_text()
    config = yaml.safe_load((root / "configs" / "default.yaml").read_text())
    assert config["trainer"]["logger"]["class_path"] == "lightning.pytorch.loggers.WandbLogger"
    assert config["trainer"]["logger"]["init_args"]["project"] == "vision"
    preset = yaml.safe_load((root / "configs" / "logger" / "wandb.yaml").read_text())
    assert preset["trainer"]["logger"]["init_args"]["project"] == "vision"
    pyproject = (root / "pyproject.toml").read_text()
    major, minor = multigpu.__version__.split(".")[:2]
    assert f'"lightning-multigpu>={major}.{minor},<{int(major) + 1}",\n    #' in pyproject and "@ git+" not in pyproject
    assert 'description = "Faces, \\"quoted\\""' in pyproject
    assert "wandb_project: vision" in (root / ".copier-answers.yml").read_text()


def test_a_bad_project_name_is_refused_and_nothing_written(template_repo: Path, tmp_path: Path) -> None:
    done = copier("copy", "--defaults", "--data=project_name=My Project", template_repo, tmp_path / "x", cwd=tmp_path,
                  check=False)  # fmt: skip
    assert done.returncode != 0 and "lowercase letters, digits" in done.stdout + done.stderr
    assert not (tmp_path / "x" / "pyproject.toml").exists()


@pytest.mark.parametrize("source", ["git URL", "folder without git"])
def test_the_same_project_from_a_git_url_and_from_a_folder_without_git(
    template_repo: Path, projects: dict[str, Path], tmp_path: Path, source: str
) -> None:
    """The links of template/ are followed (their files' bytes, no link) from a git URL as from a checkout's path,
    and from a folder that is no git repository; the engine's source is where the project was made from."""
    if source == "git URL":
        template, engine = (
            f"git+file://{template_repo}",
            f"git+file://localhost{template_repo}@{git('rev-parse', 'HEAD', cwd=template_repo)}",
        )
    else:
        template = tmp_path / "plain"
        shutil.copytree(template_repo, template, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        engine = f"file://localhost{template.resolve()}"
    root = generate(template, tmp_path / "my-stub")
    from_path, here = files(projects["stub"]), files(root)
    assert set(here) == set(from_path)
    assert [n for n in here if n not in OWN and here[n].read_bytes() != from_path[n].read_bytes()] == []
    assert not any(p.is_symlink() for p in root.rglob("*"))
    assert f'"lightning-multigpu @ {engine}",' in (root / "pyproject.toml").read_text()


@pytest.mark.slow
def test_the_stub_project_trains_and_runs_a_sweep(projects: dict[str, Path]) -> None:
    root = projects["stub"]
    readme = (root / "README.md").read_text()
    assert all(command in readme for command in README_COMMANDS)
    assert option_keys(root) >= {o.replace(".init_args", "") for o in options_named(root)} - {"model.help"}
    fit = run(sys.executable, "-m", "src.cli", "fit", cwd=root)  # the first command's last part, as written
    assert (root / "runs" / "default" / "checkpoints" / "last.ckpt").is_file(), fit.stdout[-2000:]
    sweep = run(sys.executable, "-m", "multigpu.sweep", "run", "configs/sweep/model.yaml", "--dir", "runs/sweep",
                "--trials", "1", cwd=root)  # fmt: skip
    assert "1 of 1 trials (1 complete)" in sweep.stdout + sweep.stderr, sweep.stderr[-3000:]
    shutil.rmtree(root / "runs")  # its tests run in test_install.py, from its README's commands


@pytest.mark.slow
def test_a_project_whose_package_is_renamed_runs_as_its_own_command_line(
    projects: dict[str, Path], tmp_path: Path
) -> None:
    """``src`` renamed to ``myproj`` and ``src.`` replaced by ``myproj.`` in the files: the help, the errors, a fit
    and a sweep's trial (started by the engine's ``python -m multigpu.sweep``) run ``python -m myproj.cli``."""
    root = tmp_path / "renamed"
    shutil.copytree(projects["stub"], root, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    (root / "src").rename(root / "myproj")
    for path in files(root).values():
        path.write_text(re.sub(r"\bsrc\.", "myproj.", path.read_text()))
    assert 'cli = "myproj.cli"' in (root / "pyproject.toml").read_text()
    usage = run(sys.executable, "-m", "myproj.cli", "fit", "--help", cwd=root).stdout
    assert usage.startswith("usage: python -m myproj.cli [options] fit "), usage[:300]
    refused = run(sys.executable, "-m", "myproj.cli", "fit", "--trainer.max_epoch=1", cwd=root, check=False)
    assert refused.returncode == 2 and "`python -m myproj.cli fit --help`" in refused.stderr, refused.stderr
    steps = ["--trainer.max_steps=4", "--trainer.max_epochs=-1", "--data.samples=256", "--progress_bar=plain"]
    run(sys.executable, "-m", "myproj.cli", "fit", *steps, cwd=root)
    assert (root / "runs" / "default" / "checkpoints" / "last.ckpt").is_file()
    sweep = run(sys.executable, "-m", "multigpu.sweep", "run", "configs/sweep/model.yaml", "--dir", "runs/sweep",
                "--trials", "1", "--", *steps, cwd=root)  # fmt: skip
    assert "1 of 1 trials (1 complete)" in sweep.stdout + sweep.stderr, sweep.stderr[-3000:]
    assert "src" not in run(sys.executable, "-m", "multigpu.sweep", "run", "--help", cwd=root).stdout


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["image", "gpt"])
def test_an_example_project_trains_with_its_own_test(projects: dict[str, Path], workload: str) -> None:
    root = projects[workload]
    assert option_keys(root) >= {o.replace(".init_args", "") for o in options_named(root)} - {"model.help"}
    tests = run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "test_it_trains", "tests/test_model.py",
                cwd=root, timeout=600)  # fmt: skip
    assert "1 passed" in tests.stdout, tests.stdout


def options_named(root: Path) -> set[str]:
    """The ``--trainer.*``, ``--model.*``, ``--data.*`` ... options the project's files name."""
    return {option for path in files(root).values() for option in OPTION.findall(path.read_text())}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm")  # skips, with the reason, without the CI cluster (tests/workflows/test_slurm.py)
def test_the_stub_projects_sbatch_script_trains_on_the_ci_cluster(projects: dict[str, Path], tmp_path: Path) -> None:
    root, run_dir = projects["stub"], tmp_path / "run"
    args = "--trainer.max_steps=8 --trainer.max_epochs=-1 --data.samples=512 --data.batch_size=32 --progress_bar=plain"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/%x-%j.out", "slurm/cpu.sbatch"],
        cwd=root,  # as its README says: from the project's folder
        env=env(RUN_DIR=str(run_dir), EXTRA_ARGS=args),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    records = Jobs(tmp_path).wait(job, timeout=240)
    log = "\n".join(p.read_text() for p in tmp_path.glob("*.out"))
    assert [(r["JobState"], r["ExitCode"]) for r in records] == [("COMPLETED", "0:0")], log[-3000:]
    assert "--trainer.devices=2 --trainer.num_nodes=1" in log  # one process per task of the allocation
    assert (run_dir / "checkpoints" / "last.ckpt").is_file(), log[-3000:]
