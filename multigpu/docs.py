"""``python -m multigpu.docs``: the engine's documentation, installed with it (``documentation/``, this repository's
``docs/``), one file a line: the public interface (``engine.md``), the strategies, sweeps, troubleshooting."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "documentation"


def files() -> list[Path]:
    """The documentation's pages, by name."""
    return sorted(FOLDER.glob("*.md"))


if __name__ == "__main__":
    print("\n".join(str(path) for path in files()))
