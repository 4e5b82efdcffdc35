"""A generated project installs by its README's commands as written: made from the template's checkout with the
template's repository answered, committed, cloned elsewhere, then its README's two commands run literally in a fresh
``python3 -m venv`` with the pip that venv brings, and its first command (the install, which is what a pip decides)
with the newest pip. The project names nothing of the machine it was made on but that repository, the engine's
documentation comes with the engine, and pip refuses an engine outside the project's version range.

The repository is a bare clone of the template on this machine (a git host's stand-in: pip and copier reach it by a
``file://`` URL as they reach one on a server). Each pip's installation runs once per session, in the order a user
runs it; the tests read what it left."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.template.conftest import env, generate, git, run

# a worker of their own: the installations run beside the other template tests
pytestmark = [
    pytest.mark.xdist_group("template-install"),
    pytest.mark.slow,
    pytest.mark.extended,
    pytest.mark.timeout(1800),
]

#: what each venv gets before the README's commands: the newest pip for one (from the package index)
PIPS = {"bundled": [], "newest": ["install", "--quiet", "--upgrade", "pip"]}
#: the tests' own step, not the user's: the torch build this suite runs on, first (here a CPU build on local disk;
#: GitHub's CI job gets it from PyTorch's CPU index). The README's first command installs that build from PyTorch's
#: CPU index where there is no GPU, which finds it installed here (that index cannot be reached from this machine)
LOCAL_TORCH = ["install", "--quiet", "--no-compile", f"torch=={version('torch')}"]  # imports compile what they use


def user_env() -> dict[str, str]:
    """A user's shell: one thread per process (the tests share the cores), and Python's own bytecode cache. This
    machine sets PYTHONDONTWRITEBYTECODE=1; with torch put in without bytecode (``--no-compile``, above), every
    process of the project would compile torch's modules again (about 2.5 s each, ten processes), where a user's
    Python compiles them once."""
    result = env(OMP_NUM_THREADS="1")
    result.pop("PYTHONDONTWRITEBYTECODE", None)
    return result


@dataclass
class Installed:
    """One fresh venv's run of the README's commands in a clone of the project."""

    root: Path
    done: subprocess.CompletedProcess

    def python(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(self.root / ".venv" / "bin" / "python", *args, cwd=self.root, check=check, timeout=900)


def readme_commands(root: Path) -> list[str]:
    """The commands of the first ``bash`` block of the README's "Set up and train", as a user copies it (a line that
    ends in a backslash goes on on the next)."""
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Set up and train") :]
    return re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).replace("\\\n", "").splitlines()


@pytest.fixture(scope="session")
def repository(template_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template's repository, as its checkout's ``origin``: a bare clone holding the checkout's commit."""
    bare = tmp_path_factory.mktemp("host") / "lightning-multigpu.git"
    git("clone", "--quiet", "--bare", template_repo, bare, cwd=bare.parent)
    return bare


@pytest.fixture(scope="session")
def published(template_repo: Path, repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub project made from the checkout (a path) with the repository answered, committed as a user does."""
    folder = tmp_path_factory.mktemp("published")
    root = generate(template_repo, folder / "my-stub", f"template_repository=file://{repository}")
    git("init", "--quiet", cwd=root)
    git("add", "--all", cwd=root)
    git("commit", "--quiet", "--no-verify", "-m", "my-stub from the template", cwd=root)
    return root


@pytest.fixture(scope="session")
def installed(published: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Installed]:
    """For each pip: the project cloned into a folder of its own, a fresh venv, then the README's commands; the two
    pips' installations at once (each waits on its downloads and its disk half of the time)."""
    started, start = {}, time.monotonic()
    for name, pip in PIPS.items():
        root = tmp_path_factory.mktemp(f"clone-{name}") / "my-stub"
        git("clone", "--quiet", published, root, cwd=root.parent)
        python = root / ".venv" / "bin" / "python"
        steps = [f"{python} -m pip {shlex.join(step)}" for step in (LOCAL_TORCH, pip) if step]
        # the README's own first step, done early for the two above; then its commands as they are written: both
        # with the bundled pip, the first (the install, which is what a pip decides) with the newest
        commands = readme_commands(root) if name == "bundled" else readme_commands(root)[:1]
        script = "\n".join(["python3 -m venv .venv", *steps, *commands])
        process = subprocess.Popen(["bash", "-e", "-c", script], cwd=root, env=user_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        started[name] = (root, process)
    result = {}
    for name, (root, process) in started.items():
        stdout, stderr = process.communicate(timeout=1500)
        result[name] = Installed(root, subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    print(f"the README's commands with both pips: {time.monotonic() - start:.0f} s")
    return result


def test_the_project_names_the_templates_repository_and_nothing_of_the_machine(
    published: Path, template_repo: Path, repository: Path
) -> None:
    checkout = {str(template_repo), os.path.realpath(template_repo)}
    named = [
        f"{path.relative_to(published)}: {where}"
        for path in published.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(published).parts
        for where in checkout
        if where in path.read_text()
    ]
    assert named == []
    commit = git("rev-parse", "HEAD", cwd=template_repo)
    pyproject = (published / "pyproject.toml").read_text()
    assert f'"lightning-multigpu @ git+file://localhost{repository}@{commit}",' in pyproject  # the one engine line
    assert f"_src_path: file://{repository}\n" in (published / ".copier-answers.yml").read_text()  # copier update's
    assert "a folder of the machine" not in (published / "README.md").read_text()


def test_a_project_made_from_a_checkout_alone_says_its_engine_is_on_this_machine(
    template_repo: Path, tmp_path: Path
) -> None:
    """Without the repository answered, the project can name the checkout only; its README says so and what to do."""
    root = generate(template_repo, tmp_path / "my-stub")
    readme = " ".join((root / "README.md").read_text().split())
    assert "names the engine's source by a folder of the machine this project was made on" in readme
    assert "copier update --defaults --data template_repository=URL" in readme
    commit = git("rev-parse", "HEAD", cwd=template_repo)
    line = f'"lightning-multigpu @ git+file://localhost{template_repo}@{commit}",'
    assert line in (root / "pyproject.toml").read_text()


@pytest.mark.parametrize("pip", list(PIPS))
def test_the_readme_commands_install_train_and_pass_the_projects_tests(installed: dict[str, Installed], pip: str):
    """Both commands with the pip a fresh venv brings; with the newest pip the first, whose install it decides."""
    install = installed[pip]
    output = f"{install.done.stdout[-3000:]}\n{install.done.stderr[-5000:]}"
    assert install.done.returncode == 0, output
    version = install.python("-m", "pip", "--version").stdout
    assert version.startswith("pip 23.2.1 " if pip == "bundled" else "pip 2"), version  # the pip under test ran
    assert pip == "bundled" or not version.startswith("pip 23.2.1 "), version
    assert (install.root / "runs" / "default" / "checkpoints" / "last.ckpt").is_file(), output  # the first command
    tests_ran = re.search(r"^=+ 4 passed", install.done.stdout, re.MULTILINE)  # the second: the project's tests
    assert tests_ran if pip == "bundled" else "passed" not in install.done.stdout, output
    engine = install.python("-c", "import multigpu; print(multigpu.__file__)").stdout.strip()
    assert Path(engine).is_relative_to(install.root / ".venv"), engine  # installed from the repository, not linked


def test_the_engines_documentation_is_installed_with_it(installed: dict[str, Installed]) -> None:
    install = installed["bundled"]
    assert "`python -m multigpu.docs` lists the files" in (install.root / "README.md").read_text()
    listed = [Path(line) for line in install.python("-m", "multigpu.docs").stdout.splitlines()]
    assert {path.name for path in listed} >= {"engine.md", "strategies.md", "troubleshooting.md"}
    assert all(path.is_relative_to(install.root / ".venv") and path.stat().st_size > 0 for path in listed), listed


def test_pip_refuses_an_engine_outside_the_projects_range(
    installed: dict[str, Installed], template_repo: Path, repository: Path, tmp_path: Path
) -> None:
    """The repository gets a commit of the next major version; the project pointed at it is refused by pip, and
    the engine it had stays."""
    later = tmp_path / "later"
    git("clone", "--quiet", repository, later, cwd=tmp_path)
    init = later / "multigpu" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "(\d+)\.', lambda m: f'__version__ = "{int(m[1]) + 1}.', init.read_text()))
    git("commit", "--quiet", "--no-verify", "-am", "The next major version", cwd=later)
    git("push", "--quiet", "origin", "HEAD", cwd=later)
    install = installed["newest"]
    pyproject = install.root / "pyproject.toml"
    commit = git("rev-parse", "HEAD", cwd=template_repo)
    pyproject.write_text(pyproject.read_text().replace(commit, git("rev-parse", "HEAD", cwd=later)))
    before = install.python("-c", "import multigpu; print(multigpu.__version__)").stdout
    refused = install.python("-m", "pip", "install", "-e", ".[dev]", check=False)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert "lightning-multigpu" in refused.stderr and "conflict" in refused.stderr.lower(), refused.stderr[-3000:]
    assert install.python("-c", "import multigpu; print(multigpu.__version__)").stdout == before
