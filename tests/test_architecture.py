"""The architecture drawn from the imports: the engine (``multigpu/``) has no cycles, no module imports a layer above
its own, and none imports the project (``src/``) (that the project uses only the engine's public interface:
tests/examples/test_project.py).

The engine is layered by folder (``LAYERS``), each folder one concern: a module imports only from its own layer or
below. A new folder or top-level module must be given its layer here.

The engine's tests mirror its code (docs/development.md, "Where a test goes"): every module of ``multigpu/`` with a
function or class has its test file. The rule is the engine's: a project's own modules (``src/``) may have their tests
anywhere.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests import prewarmed
from tests.conftest import REPO, cli_env

ENGINE = REPO / "multigpu"

#: the engine's folders (and its top-level modules), bottom to top
LAYERS = {
    "multigpu.compat": 0,  # the libraries' private names
    "multigpu.errors": 0,  # errors, the failures told from them, how they are reported
    "multigpu.facts": 0,  # what the run is, before anything is built
    "multigpu.hooks": 0,  # what a model or data module may implement, and the engine's reads of it
    "multigpu.steps": 0,  # when per-step work is due
    "multigpu.moved": 0,  # the 1.x module names
    "multigpu.command": 0,  # the project's command line, as its users type it
    "multigpu.data": 1,
    "multigpu.models": 1,
    "multigpu.checkpoints": 2,
    "multigpu.strategies": 3,  # they write sharded checkpoints
    "multigpu.observe": 4,
    "multigpu.faults": 4,
    "multigpu.tuning": 4,
    "multigpu.run": 5,  # the command line to the Trainer
    "multigpu.sweep": 6,
    "multigpu.consolidate": 6,
    "multigpu.stacks": 6,
    "multigpu.docs": 6,
    "multigpu.testing": 7,
}

#: what a project may import from the engine: the public interface (``multigpu/__init__.py``), the hooks, the test
#: helpers, and the commands it may run from its own modules
PUBLIC = {"multigpu", "multigpu.hooks", "multigpu.testing", "multigpu.consolidate", "multigpu.stacks", "multigpu.sweep"}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    if module == "multigpu":
        return 7  # the public interface: it names every layer's public classes
    for prefix, number in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return number
    raise AssertionError(f"{module} has no layer: add its package to LAYERS in {__file__}")


def imports_of(folder: Path, package: str) -> dict[str, set[str]]:
    """Every module under ``folder`` with the modules of ``package`` it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if names == [package]:  # `from multigpu import moved` imports the module multigpu.moved where it is one
                modules = [alias.name for alias in node.names if (folder.parent / package / alias.name).exists()
                           or (folder.parent / package / f"{alias.name}.py").exists()]  # fmt: skip
                names = [f"{package}.{name}" for name in modules] or names
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            imported |= {name for name in names if name == package or name.startswith(package + ".")}
        graph[module_name(path)] = imported
    return graph


def mirror_test(path: Path) -> Path:
    """``tests/<package>/test_<module>.py`` for ``multigpu/<package>/<module>.py``; for a package's ``__init__.py``
    (its table of contents) and ``__main__.py`` (its command), ``tests/<package>/test_<package>.py``; for the
    engine's own ``__init__.py`` (the public interface), ``tests/test_interface.py``."""
    relative = path.relative_to(ENGINE)
    if relative == Path("__init__.py"):
        return REPO / "tests" / "test_interface.py"
    name = relative.parent.name if relative.stem in ("__init__", "__main__") else relative.stem
    return REPO / "tests" / relative.parent / f"test_{name}.py"


def has_logic(path: Path) -> bool:
    """Whether a module defines a function or a class (not only imports, constants and a command's one line)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in nodes)


def test_every_engine_module_with_logic_has_its_mirror_test_file():
    modules = [path for path in sorted(ENGINE.rglob("*.py")) if has_logic(path)]
    assert len(modules) > 20  # the walk found the package
    missing = [
        f"{path.relative_to(REPO)} (expected {mirror_test(path).relative_to(REPO)})"
        for path in modules
        if not mirror_test(path).is_file()
    ]
    assert not missing, f"engine modules without their test file: {missing}"


def test_no_engine_module_imports_a_layer_above_its_own():
    graph = imports_of(ENGINE, "multigpu")
    assert len(graph) > 20  # the walk found the package
    upward = [f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a)]
    assert not upward, f"imports pointing up the layers: {upward}"


def test_the_engine_never_imports_the_project():
    graph = imports_of(ENGINE, "src")
    assert len(graph) > 20
    found = [f"{a} -> {b}" for a, targets in graph.items() for b in sorted(targets)]
    assert not found, f"the engine imports the project: {found}"


def test_the_engines_imports_have_no_cycle():
    graph = imports_of(ENGINE, "multigpu")
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
import builtins, importlib, io, sys
opened, real_open = [], builtins.open

def counted_open(file, *args, **kwargs):
    opened.extend([file] if str(file).endswith("default.yaml") else [])
    return real_open(file, *args, **kwargs)

builtins.open = io.open = counted_open  # jsonargparse's reads and pathlib's
from pathlib import Path
cli = importlib.import_module(sys.argv.pop(1))

class UsersProject(cli.CLI):  # a project whose configs/default.yaml names its own classes
    default_config = Path(sys.argv.pop(1))

cli.run_cli(sys.argv[1:], UsersProject)
print("LOADED", sorted(m for m in sys.modules if m.startswith(("src.", "tests.", "multigpu."))), "OPENED", len(opened))
"""


def run_of_a_users_model(cli: str, tmp_path: Path) -> tuple[str, int]:
    """The modules a one-step fit through the command line ``cli``'s subclass loaded, and how often the default
    config (naming the tests' model and data module, as a generated project names its own) was opened."""
    default = tmp_path / "default.yaml"
    default.write_text("model: tests.fixtures.workload.TinyClassifier\ndata: tests.fixtures.workload.TinyData\n")
    run = [cli, str(default), "fit", "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
           "--trainer.accelerator=cpu", "--progress_bar=none",
           f"--trainer.default_root_dir={tmp_path / 'run'}"]  # fmt: skip
    result = prewarmed.run(
        [sys.executable, "-c", PROBE, *run], cwd=REPO, env=cli_env(), capture_output=True, text=True, check=True
    )
    loaded, opened = result.stdout.split("LOADED", 1)[1].split("OPENED")
    return loaded, int(opened)


def test_a_run_of_a_users_model_loads_no_tune_trainer_and_reads_the_default_config_once_per_parse(tmp_path):
    """A project's own command line (a ``TemplateCLI`` subclass) that trains its own model loads none of ``tune``'s
    Trainer; jsonargparse alone reads the default config (the project's examples: tests/examples/)."""
    loaded, opened = run_of_a_users_model("tests.cli", tmp_path)
    assert "'multigpu.tuning" not in loaded, loaded
    assert "'multigpu.models.base'" in loaded and "'tests.cli'" in loaded  # the probe saw the run's modules
    assert 1 <= opened <= 2  # for the subcommand's arguments, and for the environment's
