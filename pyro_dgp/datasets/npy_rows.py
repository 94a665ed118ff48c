"""Rows of a ``.npy`` file read by positional reads, so that reading a file of any size keeps
the process's resident memory flat.

A memory map keeps every page it has touched in the process's resident set, and on Linux a
read fault maps the whole cached folio around the page (up to 2 MiB with the large folios of
ext4 and xfs), so a batch of rows at random places of a large file, read through a map, grows
the process by a good part of the file (``benchmarks/results/history.md``, "Reading .npy rows
without a memory map"). :class:`NpyRows` instead copies each row from the kernel's page cache
with ``os.pread`` into a buffer of its own: no page of the file is ever mapped, and a
contiguous chunk is one read.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

__all__ = ["NpyRows", "open_rows"]


class NpyRows:
    """The C-ordered array of a ``.npy`` file, read row by row: ``shape``, ``dtype`` and
    :meth:`take`."""

    def __init__(self, path, offset: int, shape: tuple, dtype):
        self.path, self.offset = Path(path), int(offset)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * math.prod(self.shape[1:])
        self._file = open(self.path, "rb")  # held for the reads, closed with this object
        size = os.fstat(self._file.fileno()).st_size
        if size < self.offset + self.shape[0] * self.row_bytes:
            raise ValueError(f"{self.path} holds {size} bytes, fewer than its header's "
                             f"{self.shape} {self.dtype} array needs (a truncated file?)")

    def __del__(self):
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

    def _read(self, position: int, nbytes: int) -> bytes:
        if hasattr(os, "pread"):
            data = os.pread(self._file.fileno(), nbytes, position)
        else:  # no positional read (Windows): seek, then read
            self._file.seek(position)
            data = self._file.read(nbytes)
        if len(data) != nbytes:
            raise OSError(f"{self.path}: read {len(data)} of {nbytes} bytes at {position}")
        return data

    def take(self, index) -> np.ndarray:
        """A copy of ``array[index]``: ``index`` a slice (one read) or row indices (one read
        per row), each in ``[0, N)``."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step != 1:
                raise ValueError("NpyRows.take: slices must have step 1")
            stop = max(stop, start)
            data = self._read(self.offset + start * self.row_bytes, (stop - start) * self.row_bytes)
            return np.frombuffer(data, self.dtype).reshape((stop - start, *self.shape[1:]))
        rows, base = self.row_bytes, self.offset
        data = b"".join(self._read(base + i * rows, rows)
                        for i in np.asarray(index, dtype=np.int64).tolist())
        return np.frombuffer(data, self.dtype).reshape((-1, *self.shape[1:]))


def open_rows(a, label: str):
    """A ``.npy`` path, or a memory map of a whole C-ordered ``.npy`` file, as
    :class:`NpyRows`; any other array as it is (``numpy`` indexing: a Fortran-ordered file,
    or a map of a slice of one, keeps the pages it touches)."""
    if isinstance(a, str | os.PathLike):
        path = Path(a)
        if not path.exists():
            raise FileNotFoundError(f"{label}: no file {path}")
        try:
            a = np.load(path, mmap_mode="r")  # reads the header only
        except ValueError as err:  # numpy's words for a file shorter than its header says
            raise ValueError(f"{label}: cannot read {path} as a .npy array ({err}; a "
                             "truncated file?)") from None
        if not isinstance(a, np.memmap):
            raise ValueError(f"{label}: {path} is not a .npy array file")
    if isinstance(a, np.memmap) and a.filename is not None and a.flags.c_contiguous \
            and a.ndim >= 1 and a.shape[0] > 0:
        rows = NpyRows(a.filename, a.offset, a.shape, a.dtype)
        # numpy keeps the file's offset on a slice [k:] of a map, so its rows would be
        # misread from the file: the first and last rows must be the map's own
        if np.array_equal(rows.take([0]), a[:1]) and np.array_equal(
                rows.take([a.shape[0] - 1]), a[-1:]):
            return rows
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{label} must be a .npy path or a numpy array (memory maps included),"
                        f" got {type(a).__name__}")
    return a
