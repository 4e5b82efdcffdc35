"""The architecture drawn from the imports of ``src/``: no cycles, and no module imports a layer above its own.

Layers, bottom to top: the libraries' private names, errors and quiet (0); the user's rooms and what they build on,
data, models, strategies and checkpoints (1); the callbacks (2); the checks before launch, the run directory and its
lock, and ``tune`` (3); the command line (4); the commands built on it (5). A new module of ``src/`` must be given its
layer here.

The tests mirror the code (README "Tests"): every module of ``src/`` with a function or class has its test file.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests import prewarmed
from tests.conftest import REPO, cli_env

LAYERS = {
    "src.compat": 0,
    "src.errors": 0,
    "src.quiet": 0,
    "src.data": 1,
    "src.models": 1,
    "src.strategies": 1,
    "src.topology": 1,
    "src.checkpoints": 1,
    "src.callbacks": 2,
    "src.checks": 3,
    "src.launch": 3,
    "src.run_dir": 3,
    "src.run_lock": 3,
    "src.options": 3,
    "src.tuning": 3,
    "src.cli": 4,
    "src.sweep": 5,
    "src.consolidate": 5,
    "src.stacks": 5,
}


#: the modules tested elsewhere, with where (README "Tests"): the examples, whose tests scripts/make_it_yours.py
#: removes with them, and the two packages whose only function imports the examples when first named
TESTED_ELSEWHERE = {
    "src/models/gpt.py": "tests/examples/",
    "src/models/image_classifier.py": "tests/examples/",
    "src/data/images.py": "tests/examples/",
    "src/data/text.py": "tests/examples/",
    "src/data/corpus.py": "tests/examples/",
    "src/models/__init__.py": "tests/examples/ (src.models.CausalLanguageModel, src.models.ImageClassifier)",
    "src/data/__init__.py": "tests/examples/ (src.data.TextDataModule, src.data.CIFAR10DataModule)",
}


def module_name(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    for prefix, number in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return number
    raise AssertionError(f"{module} has no layer: add its package to LAYERS in {__file__}")


def imports_of_src() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / "src").rglob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if names == ["src"]:  # `from src import checks` imports the module src.checks
                names = [f"src.{alias.name}" for alias in node.names]
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            imported |= {name for name in names if name == "src" or name.startswith("src.")}
        graph[module_name(path)] = imported
    return graph


def mirror_test(path: Path) -> Path:
    """``tests/<package>/test_<module>.py`` for ``src/<package>/<module>.py``; for a package's ``__init__.py`` (its
    table of contents) and ``__main__.py`` (its command), ``tests/<package>/test_<package>.py``."""
    relative = path.relative_to(REPO / "src")
    name = relative.parent.name if relative.stem in ("__init__", "__main__") else relative.stem
    return REPO / "tests" / relative.parent / f"test_{name}.py"


def has_logic(path: Path) -> bool:
    """Whether a module defines a function or a class (not only imports, constants and a command's one line)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in nodes)


def test_every_module_with_logic_has_its_mirror_test_file():
    modules = [path for path in sorted((REPO / "src").rglob("*.py")) if has_logic(path)]
    assert len(modules) > 20  # the walk found the package
    missing = [
        f"{path.relative_to(REPO)} (expected {mirror_test(path).relative_to(REPO)})"
        for path in modules
        if str(path.relative_to(REPO)) not in TESTED_ELSEWHERE and not mirror_test(path).is_file()
    ]
    assert not missing, f"modules without their test file: {missing}; add it, or list the module in TESTED_ELSEWHERE"


def test_no_module_imports_a_layer_above_its_own():
    graph = imports_of_src()
    assert len(graph) > 20  # the walk found the package
    upward = [f"{a} -> {b}" for a, targets in graph.items() if a != "src" for b in targets if layer(b) > layer(a)]
    assert not upward, f"imports pointing up the layers: {upward}"


def test_the_imports_have_no_cycle():
    graph = imports_of_src()
    # a package's __init__ importing its own modules is the package's table of contents, not a cycle
    edges = {a: {b for b in targets if not a.startswith(b + ".") and b in graph} for a, targets in graph.items()}
    visiting, done, cycles = set(), set(), []

    def visit(module: str, path: list[str]) -> None:
        if module in visiting:
            cycles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        visiting.add(module)
        for target in sorted(edges.get(module, ())):
            visit(target, [*path, module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    assert not cycles, f"import cycles: {cycles}"


PROBE = """
import builtins, io, sys
opened, real_open = [], builtins.open

def counted_open(file, *args, **kwargs):
    opened.extend([file] if str(file).endswith("default.yaml") else [])
    return real_open(file, *args, **kwargs)

builtins.open = io.open = counted_open  # jsonargparse's reads and pathlib's
import src.cli
src.cli.main(sys.argv[1:])
print("LOADED", sorted(m for m in sys.modules if m.startswith("src.")), "OPENED", len(opened))
"""


def test_a_run_of_a_users_model_imports_none_of_the_examples_and_reads_the_default_config_once(tmp_path):
    """With configs/default.yaml naming the examples, a fit of a model and data module of the user's loads none of
    them (they are imported when a config names them, tests/examples/test_gpt.py, not with the package, nor to be
    compared with the classes named), nor ``tune``'s Trainer; configs/default.yaml is read once (by the template,
    which gives the parser its other sections)."""
    run = ["fit", "--model=tests.fixtures.workload.TinyClassifier", "--data=tests.fixtures.workload.TinyData",
           "--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.accelerator=cpu",
           "--progress_bar=none", f"--trainer.default_root_dir={tmp_path / 'run'}"]  # fmt: skip
    result = prewarmed.run(
        [sys.executable, "-c", PROBE, *run], cwd=REPO, env=cli_env(), capture_output=True, text=True, check=True
    )
    loaded, opened = result.stdout.split("LOADED", 1)[1].split("OPENED")
    examples = ["src.models.gpt", "src.models.image_classifier", "src.data.images", "src.data.text", "src.data.corpus"]
    assert not [name for name in [*examples, "src.tuning"] if f"'{name}" in loaded], loaded
    assert "'src.models.base'" in loaded and "'src.cli'" in loaded  # the probe saw the run's modules
    assert int(opened) == 1
