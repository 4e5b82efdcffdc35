"""Remove the example workloads and make the template train your model and data by default.

    python scripts/make_it_yours.py --model=my_project.models.MyModel --data=my_project.data.MyData

Removes the examples (the image classifier and the GPT: src/models/image_classifier.py and gpt.py,
src/data/images.py, text.py and corpus.py, their presets in configs/experiment/ and their tests in tests/examples/)
and this script's own test, drops their exports from src/models/__init__.py and src/data/__init__.py, points
configs/default.yaml at the given classes (its trainer and checkpoint sections are kept), makes
configs/default.yaml the SLURM scripts' default config, and cuts the documentation's example sections (between
``<!-- example -->`` and ``<!-- /example -->``; a comment ``<!-- yours: TEXT -->`` becomes TEXT). The benchmark
(benchmarks/) stays as it is: its built-in workloads were the examples, so afterwards it measures the classes it
is given (``python -m benchmarks --model=... --data=...``) and says so when none is.

Before touching anything it applies the same changes to a scratch copy of the project and imports both classes
there: if either cannot be imported without the examples, nothing is changed. A second run refuses: the examples
are gone. Only the standard library is used, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_FILES = [
    "src/models/image_classifier.py",
    "src/models/gpt.py",
    "src/data/images.py",
    "src/data/text.py",
    "src/data/corpus.py",
    "configs/sweep/quick.yaml",  # a first sweep over the example model's optimizer options
    "tests/workflows/test_make_it_yours.py",  # the test of this script, which has nothing left to remove afterwards
]
EXAMPLE_DIRS = ["configs/experiment", "tests/examples"]
EXAMPLE_MODULES = [path.removesuffix(".py").replace("/", ".") for path in EXAMPLE_FILES if path.startswith("src/")]
PACKAGE_INITS = ["src/models/__init__.py", "src/data/__init__.py"]
SBATCH_CONFIG = re.compile(r"\$\{CONFIG-configs/experiment/[^}]*\}")  # a script's default config: an example preset
BLOCK = re.compile(r"\n<!-- example -->\n.*?\n<!-- /example -->\n", re.DOTALL)  # marked lines of their own
INLINE = re.compile(r"<!-- example -->.*?<!-- /example -->", re.DOTALL)  # marked words within a line
YOURS = re.compile(r"<!-- yours: (.*?) -->", re.DOTALL)  # hidden now, the text after the examples are gone
#: top-level folders never copied into the scratch copy nor searched for documentation
SKIPPED = {".git", ".venv", "venv", "runs", "data", "wandb", "lightning_logs", "node_modules"}
KEPT_DOCS = "docs/benchmarks.md and docs/best_practices.md (measurements and walkthroughs made on the examples)"

#: run in the scratch copy: both classes import, and are a LightningModule and a LightningDataModule
IMPORT_CHECK = """
import importlib, sys
import lightning as L
problems = []
for option, path, base in (("--model", sys.argv[1], L.LightningModule), ("--data", sys.argv[2], L.LightningDataModule)):
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception as error:
        problems.append(f"{option}={path} cannot be imported ({type(error).__name__}: {error})")
        continue
    if not (isinstance(found, type) and issubclass(found, base)):
        problems.append(f"{option}={path} is not a {base.__name__} subclass")
print("; ".join(problems))
sys.exit(1 if problems else 0)
"""


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def without_exports(text: str, modules: list[str]) -> str:
    """``text`` of a package ``__init__.py`` without the imports from ``modules`` (``from M import A, B`` lines, and
    ``"A": "M",`` entries of its table of examples imported on first use) and their names in ``__all__``."""
    names: list[str] = []
    kept = []
    for line in text.splitlines(keepends=True):
        imported = re.match(r"from (\S+) import (.+)", line)
        lazy = re.match(r'\s*"(\w+)": "(\S+)",$', line.rstrip("\n"))
        if imported and imported.group(1) in modules:
            names += [name.strip() for name in imported.group(2).split(",")]
        elif lazy and lazy.group(2) in modules:
            names.append(lazy.group(1))
        else:
            kept.append(line)
    text = "".join(kept)
    for name in names:  # one entry per line, or several on one line
        text = re.sub(rf'\n\s*"{name}",(?=\n)|"{name}",\s*|,\s*"{name}"(?=\s*\])', "", text)
    return text


def default_config(text: str, model: str, data: str) -> str:
    """configs/default.yaml with its ``model`` and ``data`` sections replaced by the given classes (no init_args:
    the classes' own defaults), every other section and comment kept."""
    sections = {"model": model, "data": data}
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        key = re.match(r"([A-Za-z_]+):", line)
        if key:
            skipping = key.group(1) in sections
            if skipping:
                out.append(f"{key.group(1)}:\n  class_path: {sections.pop(key.group(1))}\n\n")
        if not skipping:
            out.append(line)
    text = "".join(out).rstrip("\n") + "\n"
    for key, class_path in sections.items():  # a section the file did not have
        text += f"\n{key}:\n  class_path: {class_path}\n"
    return re.sub(
        r"^# A bare `python -m src\.cli fit` trains .*$",
        f"# A bare `python -m src.cli fit` trains {model} on {data}.",
        text,
        count=1,
        flags=re.MULTILINE,
    )


def documentation(root: Path) -> list[Path]:
    """Markdown files of the project, outside the folders that hold no documentation of it."""
    return sorted(path for path in root.rglob("*.md") if path.relative_to(root).parts[0] not in SKIPPED)


def strip_examples(root: Path, model: str, data: str) -> list[str]:
    """Apply every change to the project at ``root``; return what was done, one line each."""
    done: list[str] = []
    for relative in EXAMPLE_FILES:
        if (root / relative).is_file():
            (root / relative).unlink()
            done.append(f"removed  {relative}")
    for relative in EXAMPLE_DIRS:
        if (root / relative).is_dir():
            shutil.rmtree(root / relative)
            done.append(f"removed  {relative}/")
    for relative in PACKAGE_INITS:
        path = root / relative
        text = path.read_text()
        if without_exports(text, EXAMPLE_MODULES) != text:
            path.write_text(without_exports(text, EXAMPLE_MODULES))
            done.append(f"changed  {relative}: no exports of the examples")
    path = root / "configs" / "default.yaml"
    path.write_text(default_config(path.read_text(), model, data))
    done.append(f"changed  configs/default.yaml: model {model}, data {data} (trainer and checkpoint kept)")
    for path in sorted((root / "slurm").glob("*.sbatch")):
        text = path.read_text()
        if SBATCH_CONFIG.search(text):
            path.write_text(SBATCH_CONFIG.sub("${CONFIG-}", text))
            done.append(f"changed  {path.relative_to(root)}: default config configs/default.yaml")
    for path in documentation(root):
        text = path.read_text()
        cut = YOURS.sub(r"\1", INLINE.sub("", BLOCK.sub("\n", text)))
        if cut != text:
            path.write_text(cut)
            done.append(f"changed  {path.relative_to(root)}: example sections cut")
    return done


def scratch_ignore(folder: str, names: list[str]) -> list[str]:
    """What the scratch copy leaves out: the top-level folders of SKIPPED, caches and checkpoints."""
    top = Path(folder) == ROOT
    return [n for n in names if (top and n in SKIPPED) or n == "__pycache__" or n.endswith(".ckpt")]


def importable_without_examples(model: str, data: str) -> str | None:
    """Why the classes cannot be used once the examples are gone (checked in a scratch copy), or None."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / ROOT.name
        shutil.copytree(ROOT, copy, ignore=scratch_ignore, symlinks=True)
        strip_examples(copy, model, data)
        # the copy first on the path, so that its src/ (without the examples) is the one imported
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
        result = subprocess.run(
            [sys.executable, "-c", IMPORT_CHECK, model, data], cwd=copy, env=env, capture_output=True, text=True
        )
    if result.returncode == 0:
        return None
    return result.stdout.strip() or result.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="class path of your LightningModule, e.g. my_project.MyModel")
    parser.add_argument("--data", required=True, help="class path of your LightningDataModule")
    args = parser.parse_args(argv)
    remaining = [p for p in [*EXAMPLE_FILES, *EXAMPLE_DIRS] if (ROOT / p).exists()]
    if not remaining:
        fail(
            f"the examples are already removed from {ROOT} (no {', '.join(EXAMPLE_FILES)}, {', '.join(EXAMPLE_DIRS)});"
            " nothing was changed. Fix: to train other classes by default, edit the model and data sections of"
            " configs/default.yaml (or pass --model=... --data=... to python -m src.cli)."
        )
    problem = importable_without_examples(args.model, args.data)
    if problem is not None:
        fail(
            f"{problem} once the examples are removed, so nothing was changed. Fix: give the class paths of your own"
            " LightningModule and LightningDataModule, importable from the project root (e.g. a package"
            " my_project/ beside src/, or src/models/my_model.py and src/data/my_data.py) and not defined in or"
            f" importing the examples ({', '.join(EXAMPLE_MODULES)})."
        )
    for line in strip_examples(ROOT, args.model, args.data):
        print(line)
    print(f"kept     {KEPT_DOCS}")
    print("next     python -m src.cli fit; python -m pytest -m 'not slow'")
    print(f"         python -m benchmarks --quick --model={args.model} --data={args.data}")


if __name__ == "__main__":
    main()
