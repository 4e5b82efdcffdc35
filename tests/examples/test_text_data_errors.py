"""The example text data module names a text file it cannot read: permission denied, with the option."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.test_quiet import fails_with

TEXT_WORKLOAD = ["--model=src.models.CausalLanguageModel", "--data=src.data.TextDataModule"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: permission denied cannot happen")
def test_an_unreadable_text_file_is_permission_denied_not_a_missing_file(tmp_path, capsys):
    folder = tmp_path / "private"
    folder.mkdir()
    text = folder / "corpus.txt"
    text.write_text("A short text. " * 100)
    for locked, needle in ((text, "readable for this user"), (folder, "permission denied")):
        locked.chmod(0)
        try:
            args = ["fit", *TINY, *TEXT_WORKLOAD]
            message = fails_with(
                capsys, [*args, f"--data.init_args.path={text}", f"--trainer.default_root_dir={tmp_path}"]
            )
            assert "permission denied" in message and needle in message and "is not a file" not in message, message
        finally:
            locked.chmod(0o755)


def test_a_text_file_that_cannot_be_read_is_permission_denied_with_the_option(tmp_path, capsys, monkeypatch):
    """The same, where the tests run as root: the read itself fails as it does for another user's file."""
    text = tmp_path / "corpus.txt"
    text.write_text("A short text. " * 100)
    read_text = Path.read_text

    def denied(self: Path, *args, **kwargs) -> str:
        if self == text:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    args = ["fit", *TINY, *TEXT_WORKLOAD]
    message = fails_with(capsys, [*args, f"--data.init_args.path={text}", f"--trainer.default_root_dir={tmp_path}"])
    assert f"permission denied: {text}" in message and f"make --data.init_args.path={text} readable" in message
