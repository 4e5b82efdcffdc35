"""The documentation's references hold: every relative link of ``README.md`` and ``docs/*.md`` leads to a file of the
repository, and its ``#anchor`` to a heading of that file (GitHub's slugs); every repository path the pages name in
backticks exists; every code fence opens on a line of its own, so that no text below it renders as code; and
``python -m multigpu.docs`` lists these pages as the engine installs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from multigpu import docs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: files the pages name that are not this repository's: a user's own model, data and configs, a generated project's
NOT_HERE = {
    "src/models/my_model.py",
    "src/data/my_data.py",
    "configs/experiment/mine.yaml",
    "configs/mine.yaml",
    "tests/test_model.py",
}

#: the example project's folders: the paths the pages name in them are checked with the examples
#: (tests/examples/test_pages.py), so that these checks pass with the examples deleted
EXAMPLE_PROJECT = ("src/", "configs/experiment/", "tests/examples/")

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
#: marks of a placeholder in a path: `multigpu/<module>.py`, `{{ engine_docs }}/README.md`, `$REPO/.venv`
PLACEHOLDER = re.compile(r"[<>{}$]")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text as rendered (no code marks, links by their text), lower case, without
    punctuation but ``-`` and ``_``, spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("\\", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, the second of two equal ones with ``-1`` and so on, as GitHub numbers them."""
    found, counts = set(), {}
    for _, line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if match:
            name = slug(match.group(2))
            found.add(f"{name}-{counts[name]}" if name in counts else name)
            counts[name] = counts.get(name, 0) + 1
    return found


def repository_entries(root: Path) -> set[str]:
    """The top-level files and folders of the repository, without what ``.gitignore`` keeps out of it (``runs/``,
    ``data/``, the virtual environment): a path starting with one of them names a file of the repository."""
    ignored = [line.strip().strip("/") for line in (root / ".gitignore").read_text().splitlines()]
    patterns = [pattern for pattern in ignored if pattern and not pattern.startswith("#")]
    return {p.name for p in root.iterdir() if p.name != ".git" and not any(fnmatch(p.name, x) for x in patterns)}


def named_paths(code: str, entries: set[str]) -> list[str]:
    """The repository paths a span of inline code names: its words that start with a top-level entry."""
    paths = []
    for word in re.split(r"[\s=,()\[\]\"']+", code):
        word = word.split("::")[0].split("#")[0].rstrip(":;.")
        if word and word.split("/")[0] in entries and not PLACEHOLDER.search(word):
            paths.append(word)
    return paths


def exists(root: Path, path: str) -> bool:
    return any(root.glob(path)) if "*" in path else (root / path).exists()


def page_problems(page: Path, root: Path = ROOT, examples: bool | None = None) -> list[str]:
    """Every broken reference of ``page``, as ``page:line: what``; with ``examples`` False those to paths outside the
    example project (``EXAMPLE_PROJECT``) only, True those inside it only."""

    def checked(path: str) -> bool:
        return examples is None or path.startswith(EXAMPLE_PROJECT) == examples

    name, entries, problems = page.relative_to(root), repository_entries(root), []
    text = page.read_text()
    if sum(1 for line in text.splitlines() if FENCE.match(line)) % 2 and checked(""):
        problems.append(f"{name}: a code fence is never closed")
    for number, line in prose_lines(text):
        where = f"{name}:{number}"
        code_spans = [match.group(2) for match in INLINE_CODE.finditer(line)]
        if "```" in line and checked(""):
            problems.append(f"{where}: a code fence inside a line of text (a fence opens on a line of its own)")
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:: not a file of the repository
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not checked(os.path.relpath(linked, root.resolve())):
                continue
            if not linked.exists():
                problems.append(f"{where}: the link {target} leads to no file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}: the link {target} names no heading of {linked.name}")
        for code in code_spans:
            missing = [path for path in named_paths(code, entries) if path not in NOT_HERE and checked(path)]
            problems += [f"{where}: `{path}` does not exist" for path in missing if not exists(root, path)]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_anchor_and_path_a_page_names_exists(page):
    """Those outside the example project (the example project's: tests/examples/test_pages.py)."""
    problems = page_problems(page, examples=False)
    assert not problems, "\n".join(problems)


def test_a_broken_link_anchor_path_or_fence_is_found(tmp_path):
    """The checks themselves, on a page with one mistake of each kind and the forms that are fine."""
    (tmp_path / ".gitignore").write_text("/runs/\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "cli.py").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## Its `code`: a part\n\n## Its `code`: a part\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#its-code-a-part) [fine](other.md#its-code-a-part-1) [fine](#page) [web](https://x.org/y)\n"
        "`python -m src.cli --config src/cli.py`, `runs/default/last.ckpt`, `src/<module>.py`, `src/data/my_data.py`\n"
        "[gone](missing.md) [no heading](other.md#nowhere) [fenced](#a-comment-not-a-heading) `src/gone.py`\n"
        "a first sweep takes minutes:```bash\n"
        "```\n# a comment, not a heading\n```\n"
    )
    problems = page_problems(page, tmp_path)
    assert problems == [
        "docs/page.md:5: the link missing.md leads to no file",
        "docs/page.md:5: the link other.md#nowhere names no heading of other.md",
        "docs/page.md:5: the link #a-comment-not-a-heading names no heading of page.md",
        "docs/page.md:5: `src/gone.py` does not exist",
        "docs/page.md:6: a code fence inside a line of text (a fence opens on a line of its own)",
    ]
    # the example project's paths apart from the rest, and together all of them
    assert page_problems(page, tmp_path, examples=True) == ["docs/page.md:5: `src/gone.py` does not exist"]
    assert page_problems(page, tmp_path, examples=False) == [p for p in problems if "src/gone.py" not in p]
    (tmp_path / "docs" / "open.md").write_text("text\n```bash\nnever closed\n")
    assert page_problems(tmp_path / "docs" / "open.md", tmp_path)[0] == "docs/open.md: a code fence is never closed"


def test_the_engine_lists_its_documentation_as_installed() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "multigpu.docs"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert [line.rsplit("/", 1)[-1] for line in listed] == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert "engine.md" in {path.name for path in docs.files()}
    assert all(path.read_bytes() == (ROOT / "docs" / path.name).read_bytes() for path in docs.files())
