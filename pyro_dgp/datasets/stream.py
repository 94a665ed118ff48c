"""Data that need not fit in memory: rows read on demand from a ``.npy`` file (memory-mapped),
an array, a map-style or an iterable ``torch.utils.data.Dataset``, standardised from one pass
of running moments.

A stream is given to :func:`pyro_dgp.fit` in place of ``X`` (and ``y``): each step reads only
the rows of its minibatch, converted to the model's dtype and device, so memory does not grow
with the number of rows N. Under ``torch.distributed`` every process reads only its own rows,
and the standardising pass is split between the processes and merged.

- the standardising pass: :class:`~pyro_dgp.datasets.moments.RunningMoments`, merged over
  the processes, give a :class:`~pyro_dgp.datasets.moments.Standardization`;
- :class:`ArrayStream`: ``X (N, D)`` and ``y (N,)`` as ``.npy`` paths, memory maps or
  arrays; :class:`DatasetStream`: a map-style dataset of ``(x, y)`` items;
  :class:`IterableStream`: an iterable dataset of ``(x, y)`` items, read in order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from .moments import RunningMoments, Standardization, merged_over_processes, process_share
from .npy_rows import NpyRows, open_rows

__all__ = ["ArrayStream", "DatasetStream", "IterableStream", "RowStream", "as_stream"]

#: rows read per chunk by the standardising pass (D = 8 float32 columns: 2 MiB)
CHUNK_ROWS = 65536


class RowStream:
    """Rows ``(x, y)`` read on demand: the interface :func:`pyro_dgp.fit` and
    :func:`pyro_dgp.prediction.streaming.predict_chunks` read.

    ``num_data`` N, ``num_columns`` D, ``standardization`` (``None``: rows as stored),
    ``random_access``: whether :meth:`read` takes any rows (else :meth:`iterate` reads them
    in order)."""

    num_data: int
    num_columns: int
    random_access: bool = True
    standardization: Standardization | None = None

    def read(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw rows ``index`` ``(n,)``: ``X (n, D)``, ``y (n,)`` as stored."""
        raise NotImplementedError(f"{type(self).__name__} reads its rows in order only")

    def iterate(self, start: int = 0, stop: int | None = None,
                chunk_rows: int = CHUNK_ROWS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Raw rows ``[start, stop)`` in chunks of at most ``chunk_rows``."""
        stop = self.num_data if stop is None else stop
        for lo in range(start, stop, chunk_rows):
            yield self.read(np.arange(lo, min(lo + chunk_rows, stop)))

    def to_tensors(self, X, y, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw rows as standardised tensors (arithmetic in float64, then ``dtype``)."""
        X = torch.from_numpy(np.array(X, dtype=np.float64)).reshape(-1, self.num_columns)
        y = torch.from_numpy(np.array(y, dtype=np.float64)).reshape(-1)
        if self.standardization is not None:
            X, y = self.standardization.apply(X, y)
        return X.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)

    def rows(self, index, dtype: torch.dtype = torch.float64, device="cpu"):
        """Standardised rows ``index``: ``X (n, D)``, ``y (n,)`` in ``dtype`` on ``device``."""
        index = np.asarray(index, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.num_data):
            raise IndexError(f"row indices must lie in [0, {self.num_data}), got "
                             f"[{index.min()}, {index.max()}]")
        return self.to_tensors(*self.read(index), dtype, device)

    def sample(self, n: int, seed: int = 0, dtype: torch.dtype = torch.float64, device="cpu"):
        """``n`` standardised rows drawn without replacement from ``seed`` (all rows, in order,
        if ``n >= N``; the first ``n`` rows for a stream read in order), to build a model from
        (k-means inducing inputs, PCA means): ``X (n, D)``, ``y (n,)``."""
        if not self.random_access:
            X, y = next(self.iterate(chunk_rows=n))
            return self.to_tensors(X, y, dtype, device)
        if n >= self.num_data:
            index = np.arange(self.num_data)
        else:
            index = np.sort(np.random.default_rng(seed).choice(self.num_data, n, replace=False))
        return self.rows(index, dtype, device)

    def own_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This process's rows in chunks: its contiguous share under ``torch.distributed``
        (all rows outside a process group)."""
        return self.iterate(*process_share(self.num_data))

    def _standardize(self, targets: bool) -> None:
        """One pass over this process's rows, the moments merged over the processes."""
        x = RunningMoments(self.num_columns)
        y = RunningMoments(1)
        for X_chunk, y_chunk in self.own_chunks():
            x.update(X_chunk)
            if targets:
                y.update(y_chunk)
        x = merged_over_processes(x)
        y = merged_over_processes(y) if targets else None
        if self.random_access and x.count != self.num_data:
            raise ValueError(f"the standardising pass saw {x.count} rows, but the stream has "
                             f"num_data = {self.num_data}")
        self.standardization = Standardization.from_moments(x, y)


def _setup(stream: RowStream, standardize: bool, targets: bool,
           standardization: Standardization | None) -> None:
    if standardization is not None:
        if not isinstance(standardization, Standardization):
            raise TypeError("standardization must be a pyro_dgp.datasets.Standardization, "
                            f"got {type(standardization).__name__}")
        if standardization.X_mean.shape != (stream.num_columns,):
            raise ValueError(f"standardization is for {standardization.X_mean.shape[0]} columns,"
                             f" the stream has {stream.num_columns}")
        stream.standardization = standardization
    elif standardize:
        stream._standardize(targets)


class ArrayStream(RowStream):
    """``X (N, D)`` and ``y (N,)`` (or ``(N, 1)``) as ``.npy`` paths, memory maps
    (``np.load(path, mmap_mode="r")``) or arrays, of any float dtype.

    A ``.npy`` file (a path, or a memory map of the whole C-ordered file) is read row by row
    with positional reads (:mod:`~pyro_dgp.datasets.npy_rows`), never mapped, so an epoch
    over a file larger than memory keeps the process's resident memory flat. With
    ``standardize`` (default) the constructor makes one pass over the rows (each process of
    a ``torch.distributed`` group over its own share, merged: every process must construct
    the stream) and :meth:`rows` returns standardised rows; ``targets=False`` leaves ``y``
    as it is (class labels); ``standardization=``: use given statistics instead (a test set
    with its training set's)."""

    def __init__(self, X, y, *, standardize: bool = True, targets: bool = True,
                 standardization: Standardization | None = None):
        self._X = open_rows(X, "X")
        self._y = open_rows(y, "y")
        x_shape, y_shape = self._X.shape, self._y.shape
        if len(x_shape) != 2:
            raise ValueError(f"X must have shape (N, D), got {x_shape}")
        if not (len(y_shape) == 1 or (len(y_shape) == 2 and y_shape[1] == 1)):
            raise ValueError(f"y must have shape (N,) or (N, 1), got {y_shape}")
        if y_shape[0] != x_shape[0]:
            raise ValueError(f"y has {y_shape[0]} rows but X has {x_shape[0]}")
        if x_shape[0] == 0:
            raise ValueError("X has no rows")
        for name, a in (("X", self._X), ("y", self._y)):
            if not np.issubdtype(a.dtype, np.floating):
                raise TypeError(f"{name} must hold floating-point values, got {a.dtype}")
        self.num_data, self.num_columns = x_shape
        _setup(self, standardize, targets, standardization)

    @staticmethod
    def _take(a, index) -> np.ndarray:
        return a.take(index) if isinstance(a, NpyRows) else a[index]

    def read(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._take(self._X, index), self._take(self._y, index).reshape(-1)

    def iterate(self, start: int = 0, stop: int | None = None, chunk_rows: int = CHUNK_ROWS):
        stop = self.num_data if stop is None else stop
        for lo in range(start, stop, chunk_rows):
            hi = min(lo + chunk_rows, stop)
            yield self._take(self._X, slice(lo, hi)), self._take(self._y, slice(lo, hi))


class DatasetStream(RowStream):
    """A map-style ``torch.utils.data.Dataset`` of ``(x (D,), y ())`` items, read item by item
    (standardisation as :class:`ArrayStream`)."""

    def __init__(self, dataset: Dataset, *, standardize: bool = True, targets: bool = True,
                 standardization: Standardization | None = None):
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise TypeError("DatasetStream takes a map-style Dataset; use IterableStream for "
                            f"an iterable one, got {type(dataset).__name__}")
        try:
            self.num_data = len(dataset)
        except TypeError:
            raise TypeError("DatasetStream: the dataset must have a length (__len__)") from None
        if self.num_data == 0:
            raise ValueError("the dataset has no items")
        self.dataset = dataset
        self.num_columns = _item(dataset[0], 0)[0].reshape(-1).shape[0]
        _setup(self, standardize, targets, standardization)

    def read(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        items = [_item(self.dataset[int(i)], int(i)) for i in index]
        if not items:
            return np.zeros((0, self.num_columns)), np.zeros(0)
        return (np.stack([x.reshape(-1) for x, _ in items]),
                np.stack([y.reshape(()) for _, y in items]))


def _item(item, position) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of a dataset item as float64 arrays, or an error naming the item."""
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise TypeError(f"dataset item {position} must be a pair (x, y), got "
                        f"{type(item).__name__}")
    x, y = (np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v,
                       dtype=np.float64) for v in item)
    if y.size != 1:
        raise ValueError(f"dataset item {position}: y must be one number, got shape {y.shape}")
    return x, y


class IterableStream(RowStream):
    """An iterable ``torch.utils.data.Dataset`` of ``(x (D,), y ())`` items, read in order
    and restarted at its end.

    Under ``torch.distributed`` the dataset yields this process's own rows (as torch's
    ``DataLoader`` leaves sharding of iterable datasets to the dataset: shard by
    ``torch.distributed.get_rank()``); ``num_data`` is the number of rows of all processes
    together (N, the scale of the likelihood). The standardising pass reads the dataset once
    in each process, and the moments are merged."""

    random_access = False

    def __init__(self, dataset, num_data: int, *, standardize: bool = True,
                 targets: bool = True, standardization: Standardization | None = None):
        if not hasattr(dataset, "__iter__"):
            raise TypeError(f"IterableStream takes an iterable dataset, got "
                            f"{type(dataset).__name__}")
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data <= 0:
            raise ValueError(f"num_data must be a positive integer (the rows of all processes),"
                             f" got {num_data!r}")
        self.dataset, self.num_data = dataset, num_data
        first = next(iter(dataset), None)
        if first is None:
            raise ValueError("the iterable dataset yields no items")
        self.num_columns = _item(first, 0)[0].reshape(-1).shape[0]
        self._items: Iterator | None = None
        _setup(self, standardize, targets, standardization)

    def iterate(self, start: int = 0, stop: int | None = None, chunk_rows: int = CHUNK_ROWS):
        """This process's items, once through, in chunks (``start``, ``stop``: ignored; the
        dataset's own shard is read)."""
        X, y = [], []
        for position, item in enumerate(self.dataset):
            x_i, y_i = _item(item, position)
            X.append(x_i.reshape(-1))
            y.append(y_i.reshape(()))
            if len(X) == chunk_rows:
                yield np.stack(X), np.stack(y)
                X, y = [], []
        if X:
            yield np.stack(X), np.stack(y)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` raw items of this process's rows, restarting at the end."""
        X, y = [], []
        restarted = False
        while len(X) < n:
            if self._items is None:
                self._items = iter(self.dataset)
            item = next(self._items, None)
            if item is None:
                if restarted:
                    raise ValueError("the iterable dataset yields no items")
                self._items, restarted = None, True
                continue
            restarted = False
            x_i, y_i = _item(item, len(X))
            X.append(x_i.reshape(-1))
            y.append(y_i.reshape(()))
        return np.stack(X), np.stack(y)

    def own_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This process's items once through (the dataset yields this process's shard)."""
        return self.iterate()


def as_stream(X, y=None) -> RowStream:
    """``X`` as a :class:`RowStream`: a stream as it is; ``.npy`` paths or arrays ``X``,
    ``y`` as an :class:`ArrayStream`; a map-style dataset as a :class:`DatasetStream`; rows
    as stored (not standardised: build the stream yourself to standardise)."""
    if isinstance(X, RowStream):
        if y is not None:
            raise ValueError("y must be None when X is a stream (the stream holds the targets)")
        return X
    if isinstance(X, IterableDataset):
        raise TypeError("an IterableDataset has no row count for the likelihood's scale N: "
                        "pass IterableStream(dataset, num_data=N)")
    if isinstance(X, Dataset):
        if y is not None:
            raise ValueError("y must be None when X is a Dataset (its items are (x, y) pairs)")
        return DatasetStream(X, standardize=False)
    if y is None:
        raise ValueError("y is required with array inputs X")
    return ArrayStream(X, y, standardize=False)
