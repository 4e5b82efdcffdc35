"""What a model may implement (``multigpu/hooks/__init__.py``): the engine reads each hook only there and through
its readers
(``multigpu/hooks/readers.py``, tested in tests/hooks/test_readers.py)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Protocol

from multigpu import hooks
from tests.conftest import REPO


def test_the_engine_reads_every_hook_name_only_here():
    """A hook's name as a string literal anywhere else in the engine would be a hook this module does not list."""
    names = {*hooks.FLOPS_HOOKS, hooks.DP_MODULES, *hooks.PIPELINE_HOOKS, hooks.CHECK_DATAMODULE}
    found = []
    for path in sorted((REPO / "multigpu").rglob("*.py")):
        if path.name in ("hooks.py", "hook_readers.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
                literal = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                found += [f"{Path(path).relative_to(REPO)}:{node.lineno}: {v}" for v in literal if v in names]
    assert not found, found


def test_every_protocol_is_what_the_engine_reads_its_hook_through():
    """Each Protocol here is used where its hook is read: a Protocol no feature checks would be a contract nothing
    holds to (as ``CountsFlops`` alone was, which a model with ``flops_per_batch`` failed)."""
    protocols = {n for n, v in vars(hooks).items() if getattr(v, "_is_protocol", False) and v is not Protocol}
    assert len(protocols) == 7, protocols
    used = set()
    for path in (REPO / "multigpu").rglob("*.py"):
        if path.name != "hooks.py":
            used |= {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
    assert not protocols - used, protocols - used
