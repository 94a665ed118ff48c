"""Moments of data seen in chunks, merged across chunks and across the processes of a
``torch.distributed`` group, and the standardisation they give.

- :class:`RunningMoments`: per-column count, mean and sum of squared deviations in float64,
  merged by Chan, Golub and LeVeque 1979 (mergeable, so one pass over chunks, or over the
  processes' shares, gives the moments of the whole);
- :class:`Standardization`: the means and standard deviations that standardise ``X`` and
  ``y`` (constant columns: 1), as :class:`~pyro_dgp.datasets.Split` keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as torch_dist

__all__ = ["RunningMoments", "Standardization", "merged_over_processes", "process_share"]


class RunningMoments:
    """Per-column moments of rows seen in chunks: ``count`` n, ``mean`` and ``m2`` (the sum of
    squared deviations from the mean), ``low`` and ``high`` (min and max), all ``(D,)``
    float64.

    Each chunk's mean and ``m2`` are computed directly (two passes over the chunk, which is in
    memory), then merged with the moments so far (Chan, Golub and LeVeque 1979)::

        n = n_a + n_b,  delta = mean_b - mean_a,
        mean = mean_a + delta n_b / n,  m2 = m2_a + m2_b + delta^2 n_a n_b / n.

    No sum of squares of the raw values is formed, so data far from zero keep their digits
    (``sum x^2 - n mean^2`` loses all of them for ``1e8 + U(0, 1)`` even in float64).
    """

    def __init__(self, num_columns: int):
        self.count = 0
        self.mean = torch.zeros(num_columns, dtype=torch.float64)
        self.m2 = torch.zeros(num_columns, dtype=torch.float64)
        self.low = torch.full((num_columns,), torch.inf, dtype=torch.float64)
        self.high = torch.full((num_columns,), -torch.inf, dtype=torch.float64)

    @property
    def num_columns(self) -> int:
        return self.mean.shape[0]

    def update(self, rows) -> RunningMoments:
        """Add the rows ``(n, D)`` (or ``(n,)`` for one column) of a chunk; returns ``self``."""
        rows = torch.from_numpy(np.array(rows, dtype=np.float64)).reshape(-1, self.num_columns)
        if not bool(torch.isfinite(rows).all()):
            raise ValueError(f"the data contain NaN or inf values (in a chunk of {len(rows)} "
                             "rows being standardised)")
        if len(rows) == 0:
            return self
        chunk = RunningMoments(self.num_columns)
        chunk.count = len(rows)
        chunk.mean = rows.mean(0)
        chunk.m2 = ((rows - chunk.mean) ** 2).sum(0)
        chunk.low, chunk.high = rows.min(0).values, rows.max(0).values
        return self.merge(chunk)

    def merge(self, other: RunningMoments) -> RunningMoments:
        """Merge the moments of other rows into these (Chan et al. 1979); returns ``self``."""
        if other.num_columns != self.num_columns:
            raise ValueError(f"cannot merge moments of {other.num_columns} columns into "
                             f"{self.num_columns}")
        if other.count == 0:
            return self
        n_a, n_b = self.count, other.count
        n = n_a + n_b
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + other.m2 + delta**2 * (n_a * n_b / n)
        self.low = torch.minimum(self.low, other.low)
        self.high = torch.maximum(self.high, other.high)
        self.count = n
        return self

    @property
    def variance(self) -> torch.Tensor:
        """``(D,)`` population variance ``m2 / n`` (as ``numpy.std``'s default)."""
        if self.count == 0:
            raise ValueError("no rows seen: the variance is undefined")
        return self.m2 / self.count

    def std(self) -> torch.Tensor:
        """``(D,)`` population standard deviation, 1 for a constant column (equal values,
        not a computed deviation of 0, as :class:`~pyro_dgp.datasets.Split` does)."""
        return torch.where(self.high > self.low, self.variance.sqrt(),
                           torch.ones_like(self.mean))

    def to_tensor(self) -> torch.Tensor:
        """``(1 + 4 D,)`` float64: count, mean, m2, low, high (for a collective)."""
        count = torch.tensor([float(self.count)], dtype=torch.float64)
        return torch.cat([count, self.mean, self.m2, self.low, self.high])

    @classmethod
    def from_tensor(cls, packed: torch.Tensor) -> RunningMoments:
        packed = packed.detach().cpu().to(torch.float64)
        D = (packed.shape[0] - 1) // 4
        out = cls(D)
        out.count = int(packed[0])
        out.mean, out.m2, out.low, out.high = packed[1:].split(D)
        return out


@dataclass(frozen=True)
class Standardization:
    """``X_std_units = (X - X_mean) / X_std``, ``y_std_units = (y - y_mean) / y_std``:
    ``X_mean``, ``X_std`` ``(D,)`` float64, ``y_mean``, ``y_std`` floats (0 and 1: targets
    left as they are, e.g. class labels)."""

    X_mean: torch.Tensor
    X_std: torch.Tensor
    y_mean: float = 0.0
    y_std: float = 1.0

    @classmethod
    def from_moments(cls, x: RunningMoments, y: RunningMoments | None) -> Standardization:
        if y is None:
            return cls(x.mean, x.std())
        return cls(x.mean, x.std(), float(y.mean[0]), float(y.std()[0]))

    def apply(self, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardise float64 ``X (n, D)`` and ``y (n,)``."""
        return (X - self.X_mean) / self.X_std, (y - self.y_mean) / self.y_std

    def inputs(self, X: torch.Tensor) -> torch.Tensor:
        """Standardise inputs ``X (n, D)`` (test inputs, say), in ``X``'s dtype and device."""
        return ((X - self.X_mean.to(X)) / self.X_std.to(X))


def merged_over_processes(moments: RunningMoments) -> RunningMoments:
    """The moments of every process's rows merged, in rank order, on every process of the
    default ``torch.distributed`` group (itself without one)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return moments
    packed = moments.to_tensor()
    if torch_dist.get_backend() == "nccl":  # NCCL's collectives take CUDA tensors only
        packed = packed.to(torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(packed) for _ in range(torch_dist.get_world_size())]
    torch_dist.all_gather(gathered, packed)
    merged = RunningMoments(moments.num_columns)
    for part in gathered:
        merged.merge(RunningMoments.from_tensor(part))
    return merged


def process_share(num_rows: int) -> tuple[int, int]:
    """``[start, stop)``: this process's contiguous share of ``num_rows`` rows (all of them
    outside a process group)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return 0, num_rows
    rank, world = torch_dist.get_rank(), torch_dist.get_world_size()
    return rank * num_rows // world, (rank + 1) * num_rows // world
