"""``copier update`` of a project made from an older commit of this repository: the user's edits stay, the
template's later changes come in with the engine's new version range, a conflict is left in the file as copier
leaves it (the project's README says how to resolve it), and the project still trains.

The older and newer commits are tags of a scratch clone (never of this repository): v1.0.0 is the working tree,
v1.1.0 changes two presets, the engine's version and two files the user owns."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.template.conftest import copier, generate, git, run

pytestmark = [pytest.mark.xdist_group("template"), pytest.mark.extended]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} has no {old!r}"
    path.write_text(text.replace(old, new, 1))


def commit(folder: Path, message: str) -> None:
    git("add", "--all", cwd=folder)
    git("commit", "--quiet", "--no-verify", "-m", message, cwd=folder)


@pytest.mark.slow
def test_an_update_keeps_the_users_edits_and_brings_the_templates_changes(template_repo: Path, tmp_path: Path) -> None:
    template = tmp_path / "template"
    git("clone", "--quiet", template_repo, template, cwd=tmp_path)
    git("tag", "v1.0.0", cwd=template)
    project = generate(template, tmp_path / "my-project", vcs_ref="v1.0.0")
    git("init", "--quiet", cwd=project)
    commit(project, "my-project from the template")

    # the user: their model, their defaults, their README, a dependency, and a preset line the template changes too
    edit(project / "src" / "models" / "model.py", "hidden: int = 64", "hidden: int = 96")
    edit(project / "configs" / "default.yaml", "max_epochs: 10", "max_epochs: 3")
    edit(project / "README.md", "## Layout", "Our lab keeps its data in /shared/faces.\n\n## Layout")
    ours = "`copier update` changes\n"  # the project's own dependencies follow this line
    edit(project / "pyproject.toml", ours, f'{ours}    "numpy>=1.26",\n')
    cpu = project / "configs" / "trainer" / "cpu.yaml"
    first = cpu.read_text().splitlines()[0]
    edit(cpu, first, "# One CPU process, for our laptops.")
    commit(project, "ours")

    # the template, later: a preset fixed, one changed where the user changed it too, a new engine version
    version = re.search(r'__version__ = "(\d+)\.(\d+)\.\d+"', (template / "multigpu" / "__init__.py").read_text())
    major, minor = int(version.group(1)), int(version.group(2)) + 1
    edit(template / "multigpu" / "__init__.py", version.group(0), f'__version__ = "{major}.{minor}.0"')
    edit(template / "configs" / "trainer" / "ddp_cpu.yaml", "trainer:\n", "# (the template, later)\ntrainer:\n")
    edit(template / "configs" / "trainer" / "cpu.yaml", first, "# One CPU process: the template's later words.")
    edit(template / "template" / "src" / "models" / "model.py", "hidden: int = 64", "hidden: int = 128")
    edit(template / "template" / "README.md.jinja", "## Layout", "The template's later README line.\n\n## Layout")
    commit(template, "later")
    git("tag", "v1.1.0", cwd=template)
    later = git("rev-parse", "HEAD", cwd=template)

    copier("update", "--defaults", cwd=project)  # as the project's README says: the newest tag, answers kept

    assert "_commit: v1.1.0" in (project / ".copier-answers.yml").read_text()
    pyproject = (project / "pyproject.toml").read_text()
    assert f'"lightning-multigpu[sweep]>={major}.{minor},<{major + 1}",' in pyproject  # the range moved with the engine
    assert f'"lightning-multigpu @ git+file://localhost{template}@{later}",' in pyproject  # its source to the commit
    assert '"numpy>=1.26",' in pyproject  # the user's dependency stays
    assert "# (the template, later)" in (project / "configs" / "trainer" / "ddp_cpu.yaml").read_text()
    # the files the user owns are theirs: the template's later changes to them do not come in
    assert "hidden: int = 96" in (project / "src" / "models" / "model.py").read_text()
    assert "max_epochs: 3" in (project / "configs" / "default.yaml").read_text()
    readme = (project / "README.md").read_text()
    assert "Our lab keeps its data" in readme and "The template's later README line" not in readme
    # both changed the same line: copier leaves the two versions between markers, and the README says what to do
    conflicted = cpu.read_text()
    for marker in ("<<<<<<< before updating", ">>>>>>> after updating"):
        assert marker in conflicted and f"`{marker}`" in readme, marker
    assert "for our laptops" in conflicted and "the template's later words" in conflicted

    cpu.write_text(re.sub(r"<<<<<<< before updating\n.*?=======\n(.*?)>>>>>>> after updating\n", r"\1", conflicted,
                          flags=re.DOTALL))  # fmt: skip
    assert cpu.read_text().startswith("# One CPU process: the template's later words.\ntrainer:\n")
    tests = run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "test_it_trains", cwd=project)
    assert "1 passed" in tests.stdout, tests.stdout


#: the commit of release 1.1.0, the last of 1.x, in this repository's history
RELEASE_1_1 = "0a9882c"


@pytest.mark.slow
def test_a_project_made_at_release_1_1_and_updated_to_this_release_passes_its_tests(template_repo: Path, tmp_path):
    template = tmp_path / "template"
    git("clone", "--quiet", template_repo, template, cwd=tmp_path)
    found = run("git", "cat-file", "-e", f"{RELEASE_1_1}^{{commit}}", cwd=template, check=False)
    assert found.returncode == 0, f"release 1.1.0 ({RELEASE_1_1}) is not in this clone's history: clone it whole"
    git("tag", "v1.1.0", RELEASE_1_1, cwd=template)
    git("tag", "v9.0.0", cwd=template)  # this working tree, newer than any release
    project = generate(template, tmp_path / "my-project", vcs_ref="v1.1.0")
    assert '"lightning-multigpu[sweep]>=1.1,<2",' in (project / "pyproject.toml").read_text()
    git("init", "--quiet", cwd=project)
    commit(project, "my-project at 1.1.0")

    copier("update", "--defaults", cwd=project)

    assert "_commit: v9.0.0" in (project / ".copier-answers.yml").read_text()
    version = re.search(r'__version__ = "(\d+)\.(\d+)\.\d+"', (template / "multigpu" / "__init__.py").read_text())
    major, minor = int(version.group(1)), int(version.group(2))
    assert f'"lightning-multigpu[sweep]>={major}.{minor},<{major + 1}",' in (project / "pyproject.toml").read_text()
    conflicts = [path for path in project.rglob("*") if path.is_file() and ".git" not in path.parts
                 and re.search("^<<<<<<< before updating", path.read_text(errors="ignore"), re.M)]  # fmt: skip
    assert not conflicts, f"copier left conflicts in {conflicts}"
    tests = run(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", cwd=project, timeout=900)
    assert " passed" in tests.stdout and " failed" not in tests.stdout, tests.stdout
