"""Causal language-model data: byte-level tokens from a text file, or from the embedded generated corpus."""

from __future__ import annotations

import stat
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from multigpu import FILE_SYSTEM_ERRNOS, ConfigurationError, GlobalBatchDataModule, file_system_failure
from src.data.corpus import embedded_corpus

VOCAB_SIZE = 256  # byte-level: every UTF-8 text is covered, and there is no tokenizer file to ship


def encode(text: str) -> Tensor:
    """UTF-8 bytes of ``text`` as a uint8 tensor of token ids."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone()


def decode(tokens: Tensor) -> str:
    """Inverse of ``encode``; invalid UTF-8 (a cut multi-byte character) is replaced, not raised."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


class TokenWindows(Dataset):
    """Non-overlapping windows of ``block_size + 1`` tokens; items are ``(input, target)`` shifted by one."""

    def __init__(self, tokens: Tensor, block_size: int) -> None:
        if len(tokens) < block_size + 1:
            raise ValueError(f"{len(tokens)} tokens cannot fill one window of block_size={block_size} (+1 target)")
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        window = self.tokens[start : start + self.block_size + 1].long()
        return window[:-1], window[1:]


class TextDataModule(GlobalBatchDataModule):
    """Byte-level text for next-token prediction: the end of the text is held out for validation and test.

    Args:
        path: UTF-8 text file. Unset: the embedded generated corpus (no download).
        block_size: Tokens per training sequence; must not exceed the model's ``block_size``.
        val_fraction: Share of the text (from its end) held out; half for validation, half for test.
        corpus_chars: Size of the embedded corpus when ``path`` is unset.
        batch_size: Global batch size in sequences per optimizer step (see ``GlobalBatchDataModule``).
        num_workers: Loader worker processes per training process.
        pin_memory: Pin host memory when training on a GPU.
    """

    vocab_size = VOCAB_SIZE

    def __init__(
        self,
        path: str | None = None,
        block_size: int = 128,
        val_fraction: float = 0.1,
        corpus_chars: int = 300_000,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = True,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)
        self.save_hyperparameters()
        self.path = path
        self.block_size = block_size
        self.val_fraction = val_fraction
        self.corpus_chars = corpus_chars

    def prepare_data(self) -> None:
        # checked here too, on one process and before any logger writes, so a bad file fails at once
        self._check_options()
        if self.path is not None:
            self._check_file(Path(self.path))

    def _source(self) -> str:
        if self.path is not None:
            return f"--data.init_args.path={self.path}"
        return f"--data.init_args.corpus_chars={self.corpus_chars}"

    def _check_options(self) -> None:
        if not 0 < self.val_fraction < 1:
            raise ConfigurationError(
                f"--data.init_args.val_fraction={self.val_fraction} must be between 0 and 1 (it is the share of the"
                " text held out for validation and test). Fix: e.g. --data.init_args.val_fraction=0.1."
            )
        if self.block_size < 1:
            raise ConfigurationError(
                f"--data.init_args.block_size={self.block_size} must be at least 1. Fix: e.g. 128, and the same"
                " --model.init_args.block_size or more."
            )
        if self.path is None and self.corpus_chars < 1:
            raise ConfigurationError(
                f"--data.init_args.corpus_chars={self.corpus_chars} leaves the embedded corpus empty. Fix: use the"
                " default (300000) or at least a few thousand characters."
            )

    def _unreadable(self, error: OSError) -> ConfigurationError:
        """Permission denied (or another file-system failure) on the text file, named as such."""
        if error.errno not in FILE_SYSTEM_ERRNOS:
            raise error
        return file_system_failure(
            error,
            error.filename or self.path,
            fix=f"make --data.init_args.path={self.path} readable for this user (`ls -l {self.path}`), or copy it"
            " somewhere you can read",
        )

    def _check_file(self, path: Path) -> None:
        try:
            status = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            status = None
        except OSError as error:  # e.g. a folder on the way that this user may not enter: not "no such file"
            raise self._unreadable(error) from error
        if status is None or not stat.S_ISREG(status.st_mode):
            raise ConfigurationError(
                f"--data.init_args.path={self.path} is not a file. Fix: give the path of a UTF-8 text file, or"
                " leave path unset to train on the embedded corpus."
            )
        if status.st_size == 0:
            raise ConfigurationError(
                f"--data.init_args.path={self.path} is empty. Fix: point it at a UTF-8 text file with the training"
                " text, or leave path unset to train on the embedded corpus."
            )

    def _read_text(self) -> str:
        if self.path is None:
            return embedded_corpus(self.corpus_chars)
        self._check_file(Path(self.path))
        try:
            return Path(self.path).read_text(encoding="utf-8")
        except OSError as error:
            raise self._unreadable(error) from error
        except UnicodeDecodeError as error:
            raise ConfigurationError(
                f"--data.init_args.path={self.path} is not UTF-8 text (byte {error.start} cannot be decoded)."
                " Fix: convert it, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`, and pass the converted file."
            ) from None

    def _windows(self, tokens: Tensor, part: str) -> TokenWindows:
        if len(tokens) < self.block_size + 1:
            raise ConfigurationError(
                f"--data.init_args.block_size={self.block_size} is longer than the {part} text ({len(tokens)} tokens"
                f" of {self._source()}, val_fraction={self.val_fraction}): not one sequence of block_size + 1"
                f" tokens fits. Fix: use a longer text, a smaller --data.init_args.block_size (the model's"
                f" --model.init_args.block_size must be at least as large), or a val_fraction that holds out at"
                f" least {2 * (self.block_size + 1)} tokens."
            )
        return TokenWindows(tokens, self.block_size)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self._check_options()
        tokens = encode(self._read_text())
        if len(tokens) == 0:
            raise ConfigurationError(
                f"the text of {self._source()} is empty. Fix: give a UTF-8 text file with the training text, or"
                " leave path unset to train on the embedded corpus."
            )
        held_out = int(len(tokens) * self.val_fraction)
        split, test_split = len(tokens) - held_out, len(tokens) - held_out // 2
        self.train_set = self._windows(tokens[:split], "training")
        self.val_set = self._windows(tokens[split:test_split], "validation")
        self.test_set = self._windows(tokens[test_split:], "test")
