"""Byte-level text that every Python install has: the standard library's own sources.

The corpus is every ``.py`` file under ``sysconfig``'s ``stdlib`` folder (``Lib/`` in
CPython's tree), ``site-packages`` left out, sorted by relative path and joined in that
order. The last tenth of the files is the validation split, so the split depends on the
file list alone: every rank and every run sees the same one. ``digest`` names the file
list and the bytes, so a run on another patch release says whether it saw the same data.
"""
import hashlib
import pathlib
import sys
import sysconfig

import torch

VALIDATION_FRACTION = 0.1
VOCABULARY = 256  # bytes


def stdlib_files(root=None):
    """The corpus's files, relative to ``root``, in their fixed (sorted) order."""
    root = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    return root, sorted(path.relative_to(root).as_posix() for path in root.rglob("*.py")
                        if "site-packages" not in path.relative_to(root).parts)


class Corpus:
    """The training and validation bytes, as uint8 tensors, and what identifies them."""

    def __init__(self, root=None):
        root, files = stdlib_files(root)
        boundary = len(files) - int(len(files) * VALIDATION_FRACTION)
        self.train = _joined(root, files[:boundary])
        self.validation = _joined(root, files[boundary:])
        self.digest = {
            "python": sys.version.split()[0], "files": len(files), "validation_files": len(files) - boundary,
            "file_list_sha256": hashlib.sha256("\n".join(files).encode()).hexdigest(),
            "train_bytes": len(self.train), "validation_bytes": len(self.validation),
            "split_sha256": hashlib.sha256(self.train.numpy().tobytes() + b"\0" + self.validation.numpy().tobytes())
            .hexdigest()}

    def train_batch(self, generator, batch_size, context):
        """Random windows of the training bytes: inputs and their next bytes."""
        starts = torch.randint(len(self.train) - context - 1, (batch_size,), generator=generator)
        return _windows(self.train, starts, context)

    def validation_batches(self, sequences, context, rank, size, batch_size=64):
        """This rank's share of ``sequences`` windows evenly spaced over the validation bytes
        (the same windows in every run), in batches."""
        if len(self.validation) <= context + 1:
            raise ValueError(f"the validation files hold {len(self.validation)} bytes, fewer than one window of "
                             f"{context + 1}")
        starts = torch.linspace(0, len(self.validation) - context - 1, sequences).long()[rank::size]
        return [_windows(self.validation, chunk, context) for chunk in starts.split(batch_size)]


def _joined(root, files):
    return torch.frombuffer(bytearray(b"".join((root / name).read_bytes() for name in files)), dtype=torch.uint8)


def _windows(data, starts, context):
    offsets = starts[:, None] + torch.arange(context + 1)
    tokens = data[offsets].long()
    return tokens[:, :-1], tokens[:, 1:]
