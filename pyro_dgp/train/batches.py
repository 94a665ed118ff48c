"""The minibatch of each step of :func:`~pyro_dgp.fit`: a global batch of ``B`` of the ``N``
rows, and the part of it this process evaluates.

Each step draws the global batch from the batch stream (a ``torch.Generator`` seeded alike in
every process, so every process draws the same batch), and process ``r`` of ``W`` takes its
contiguous part ``[lo, hi)`` of ``B_r = hi - lo`` rows (all of it in one process):

- tensors ``X (N, D)``, ``y (N,)`` in memory: ``B`` rows without replacement,
  ``randperm(N)[:B]`` (all rows, in order, when ``B = N``);
- a :class:`~pyro_dgp.datasets.stream.RowStream` with random access (a ``.npy`` file, a
  map-style dataset): ``B`` rows drawn uniformly with replacement (``O(B)`` time and memory
  whatever ``N``; ``randperm(N)`` would be ``O(N)`` per step), read from the stream; all rows
  in order when ``B >= N``;
- a stream read in order (an iterable dataset): this process's next ``B_r`` items.

Either way the global batch is a uniform draw, so ``(N / B) sum_i l_i`` is an unbiased
estimate of the data term of the objective (:mod:`pyro_dgp.train.distributed` for how the
processes' parts add up to it).
"""

from __future__ import annotations

import torch

from ..datasets.stream import RowStream

__all__ = ["Batches", "check_stream"]


def check_stream(model, stream: RowStream) -> int:
    """``N`` of a stream whose rows the model takes (as many columns as its inputs)."""
    input_dim = getattr(model, "input_dim", None)
    if input_dim is not None and stream.num_columns != input_dim:
        raise ValueError(f"the stream's rows have {stream.num_columns} columns, the model "
                         f"takes {input_dim}")
    return stream.num_data



class Batches:
    """The minibatches of one fit.

    :param data: ``(X (N, D), y (N,))`` tensors, or a ``RowStream``.
    :param batch_size: ``B``, the global batch (``<= N``).
    :param shard: ``(lo, hi)``, this process's part of the global batch (default: all).
    :param dtype, device: of the rows handed to the model (a stream's rows are converted).
    """

    def __init__(self, data, batch_size: int, shard: tuple[int, int] | None = None,
                 dtype: torch.dtype | None = None, device=None):
        self.stream = data if isinstance(data, RowStream) else None
        if self.stream is None:
            self.X, self.y = data
            self.num_data = self.X.shape[-2]
            dtype, device = self.X.dtype, self.X.device
        else:
            self.num_data = self.stream.num_data
        self.batch_size = batch_size
        self.lo, self.hi = shard if shard is not None else (0, batch_size)
        self.dtype, self.device = dtype, torch.device(device)

    @property
    def local_size(self) -> int:
        """``B_r``: the rows this process evaluates per step."""
        return self.hi - self.lo

    @property
    def share(self) -> float:
        """``B_r / B``: this process's weight in the global objective."""
        return self.local_size / self.batch_size

    def first(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``B`` rows, that set a guide up (in every process as in one: a set-up
        that draws, a prototype run of the model, draws the same) and check the model's
        scale (on their first ``B_r``)."""
        n = self.batch_size
        if self.stream is None:
            return self.X[:n], self.y[:n]
        if not self.stream.random_access:
            return self.stream.sample(n, dtype=self.dtype, device=self.device)
        return self.stream.rows(torch.arange(n).numpy(), self.dtype, self.device)

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's part of the step's global batch, ``X (B_r, D)``, ``y (B_r,)``."""
        N, B = self.num_data, self.batch_size
        if self.stream is None:
            if B < N:
                index = torch.randperm(N, generator=generator)[:B][self.lo:self.hi]
                index = index.to(self.X.device)
                return self.X[index], self.y[index]
            if (self.lo, self.hi) == (0, N):
                return self.X, self.y
            return self.X[self.lo:self.hi], self.y[self.lo:self.hi]
        if not self.stream.random_access:
            return self.stream.to_tensors(*self.stream.take(self.local_size), self.dtype,
                                          self.device)
        if B < N:
            index = torch.randint(N, (B,), generator=generator)[self.lo:self.hi]
        else:
            index = torch.arange(self.lo, self.hi)
        return self.stream.rows(index.numpy(), self.dtype, self.device)

    def skip(self, steps: int) -> None:
        """Move a stream read in order past the rows of ``steps`` finished steps (a resumed
        run then reads what the uninterrupted one read, for a dataset that yields the same
        items each time through); nothing for the others, whose draws come from the batch
        stream restored from the checkpoint."""
        if self.stream is not None and not self.stream.random_access:
            for _ in range(steps):
                self.stream.take(self.local_size)
