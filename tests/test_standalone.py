"""The engine's suite stands alone: no test outside tests/examples/ and tests/template/ imports, runs or reads this
repository's example project (``src/``, ``configs/experiment/``, ``tests/examples/``), so that a change to an
example cannot break the engine's tests and they pass with the example project deleted (CI collects them so, .ci/run).
They run the tests' own command line (tests/cli.py) on the tests' own workloads (tests/fixtures/, tests/zoo/). The
examples' tests, and the template's (which generates projects from the examples), may use them."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from tests.compat.test_compat import docstring_ids
from tests.conftest import REPO

TESTS = REPO / "tests"
#: where the tests that may use the example project are
USERS_OF_THE_EXAMPLES = (TESTS / "examples", TESTS / "template")
#: the modules of the example project
EXAMPLE_MODULES = ("src", "tests.examples")
#: a string that imports or runs an example module, names an example's class, or a path into the example project
USES = re.compile(
    r"\b(?:import|from)\s+(?:src|tests\.examples)\b|-m\s+src\.|\bsrc\.(?:models|data|consolidate)\b"
    r"|configs/experiment|tests/examples|\btests\.examples\b"
)
#: a path's part that leads into the example project
EXAMPLE_PARTS = {"src", "experiment", "examples"}
#: strings that name the example project without using it: the pages' checks leave the paths the pages name in it
#: to tests/examples/ (tests/test_docs.py), and a page of their own names a user's preset and a command
NAMES_ONLY = {
    "tests/test_docs.py": {"configs/experiment/mine.yaml", "configs/experiment/", "tests/examples/", "-m src.cli --"},
}
#: the suite's names of the repository's root: a path built from one is a path of this repository
ROOTS = {"REPO", "ROOT"}


def example_module(name: str) -> bool:
    return any(name == module or name.startswith(f"{module}.") for module in EXAMPLE_MODULES)


def uses_of_the_examples(source: str, names_only: set[str] = frozenset()) -> list[tuple[int, str]]:
    """``(line, what)`` of each use of the example project in ``source`` (docstrings and comments aside, and the
    parts of strings in ``names_only``)."""
    tree = ast.parse(source)
    docstrings = docstring_ids(tree)
    found = []
    for node in ast.walk(tree):
        why = None
        if isinstance(node, ast.Import) and any(example_module(alias.name) for alias in node.names):
            why = "imports it"
        elif isinstance(node, ast.ImportFrom) and example_module(node.module or ""):
            why = "imports from it"
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("import_module", "__import__")):
            names = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            why = "imports it by name" if any(example_module(name) for name in names) else None
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
            ran = [b for a, b in itertools.pairwise(words) if a == "-m" and isinstance(b, str) and example_module(b)]
            why = f"runs python -m {ran[0]}" if ran else None
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            part = node.right.value if isinstance(node.right, ast.Constant) else None
            root = node
            while isinstance(root, ast.BinOp):
                root = root.left
            of_this_repository = isinstance(root, ast.Name) and root.id in ROOTS
            why = f"a path into it (/ {part!r})" if of_this_repository and part in EXAMPLE_PARTS else None
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            for name in names_only:
                text = text.replace(name, "")
            why = "names it" if USES.search(text) else None
        if why is not None:
            found.append((node.lineno, f"{ast.unparse(node).splitlines()[0][:100]} ({why})"))
    return sorted(found)


def engine_tests() -> list[Path]:
    """Every Python file of tests/ but the examples' and the template's tests, and this one (which names them)."""
    return [
        path
        for path in sorted(TESTS.rglob("*.py"))
        if not any(path.is_relative_to(folder) for folder in USERS_OF_THE_EXAMPLES) and path != Path(__file__).resolve()
    ]


def test_no_engine_test_imports_runs_or_reads_the_example_project():
    files = engine_tests()
    assert len(files) > 100 and TESTS / "conftest.py" in files  # the walk found the suite
    found = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in files
        for line, what in uses_of_the_examples(path.read_text(), NAMES_ONLY.get(str(path.relative_to(REPO)), set()))
    ]
    assert not found, "the engine's tests use the example project (give them workloads of their own):\n" + "\n".join(
        found
    )


def test_the_scan_finds_each_kind_of_use():
    source = '''
"""A docstring may point at tests/examples/test_gpt.py and src.models.gpt."""
import src.cli
from src.models import CausalLanguageModel
from tests.examples.conftest import TINY_GPT
cli = importlib.import_module("src.cli")
command = [sys.executable, "-m", "src.cli", "fit"]
preset = REPO / "configs" / "experiment" / "gpt.yaml"
module = REPO / "src"
fake = tmp_path / "src"  # a project of the test's own
run(["fit", "--model=src.models.ImageClassifier"])
code = "import src.cli; src.cli.main()"
slurm = f"srun python -m src.cli fit {args}"
# a comment may name configs/experiment/
default = "src.cli"  # the engine's default module, named
fine = [sys.executable, "-m", "tests.cli", "fit"]
'''
    found = uses_of_the_examples(source)
    assert [line for line, _ in found] == [3, 4, 5, 6, 7, 8, 9, 11, 12, 13]
    assert "(imports it)" in found[0][1] and "(runs python -m src.cli)" in found[4][1]
    assert "(a path into it (/ 'experiment'))" in found[5][1] and "(names it)" in found[7][1]
    named = 'page = "a preset of your own: configs/experiment/mine.yaml"'
    assert uses_of_the_examples(named, {"configs/experiment/mine.yaml"}) == []
    assert len(uses_of_the_examples(named.replace("mine", "gpt"), {"configs/experiment/mine.yaml"})) == 1
