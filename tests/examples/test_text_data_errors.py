"""The example text data module names a text file it cannot read: permission denied, with the option."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.errors.test_failures import fails_with

TEXT_WORKLOAD = ["--model=src.models.CausalLanguageModel", "--data=src.data.TextDataModule"]


@pytest.mark.parametrize(
    "call",
    ["stat", "read_text"],
    ids=["a folder on the way this user may not enter", "a file this user may not read"],
)
def test_a_text_file_that_cannot_be_read_is_permission_denied_not_a_missing_file(tmp_path, capsys, monkeypatch, call):
    """The file system's answer to another user's file, simulated: the tests run as root, who reads any file."""
    text = tmp_path / "corpus.txt"
    text.write_text("A short text. " * 100)
    original = getattr(Path, call)

    def denied(self: Path, *args, **kwargs):
        if self == text:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, call, denied)
    args = ["fit", *TINY, *TEXT_WORKLOAD, f"--data.init_args.path={text}", f"--trainer.default_root_dir={tmp_path}"]
    message = fails_with(capsys, args)
    assert f"permission denied: {text}" in message and f"make --data.init_args.path={text} readable" in message
    assert "is not a file" not in message, message
