"""``python -m multigpu.docs``: the paths of the engine's documentation pages, installed with it."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "documentation"


def files() -> list[Path]:
    return sorted(FOLDER.glob("*.md"))


if __name__ == "__main__":
    print("\n".join(str(path) for path in files()))
