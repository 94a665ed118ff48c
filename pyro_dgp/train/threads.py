"""How many threads torch uses for a fit: one for small problems, where extra threads spin.

torch's intra-op threads pay a fork/join and a spin-wait on every operation. A deep GP step is
hundreds of small operations on ``(B, M)`` and ``(M, M)`` matrices, and on a machine whose
cores are busy with other processes each wait can cost a time slice. On 2 cores, below about
``3e8`` multiply-adds per step (:func:`step_work`) one thread was a little slower than two on
a quiet machine and many times faster on a busy one, and above it two were faster on both
(``BENCHMARKS.md``, "How does the step time change with torch's thread count?", from
``benchmarks/results/threads.jsonl``).

So below :data:`PARALLEL_WORK` multiply-adds per step :func:`threads_for` picks one thread,
and one more per further ``PARALLEL_WORK``, up to the cores this process may run on and never
above ``torch.get_num_threads()`` (a process that set fewer threads, one of several sharing
the cores, keeps them). The choice depends on the problem's size, the machine and that
setting only, so a seeded run is reproducible on that machine (the thread count changes the
order of floating-point sums).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from ..state import global_setting

__all__ = ["PARALLEL_WORK", "available_cores", "num_threads", "step_work", "threads_for"]

#: multiply-adds per step from which a fit uses a second thread (and one more per multiple)
PARALLEL_WORK = 3e8


def available_cores() -> int:
    """The number of cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def step_work(model, batch_size: int, num_particles: int = 1) -> float:
    """Multiply-adds of the conditionals of one step, ``P B sum_l D_l M_l^2`` over the GP
    layers of ``model`` (modules with ``output_dim`` and ``num_inducing``): the ``M x M``
    quadratic forms per point and output that dominate a step."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    per_point = sum(m.output_dim * m.num_inducing**2 for m in modules
                    if hasattr(m, "num_inducing") and hasattr(m, "output_dim"))
    return float(num_particles * batch_size * per_point)


def threads_for(work: float) -> int:
    """Threads for a step of ``work`` multiply-adds (module docstring): at most the cores
    this process may run on and ``torch.get_num_threads()``."""
    return int(min(available_cores(), torch.get_num_threads(), 1 + work // PARALLEL_WORK))


@contextlib.contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` within the block, restored after; ``None``: as is."""
    if n is None:
        yield
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    with global_setting(torch.get_num_threads, torch.set_num_threads, n):
        yield
