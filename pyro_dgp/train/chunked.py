"""The ELBO over data read in chunks: a stream that does not fit in memory, or the share of the
rows of each process of a data-parallel run.

A chunk of ``n_c`` of the ``N`` rows, evaluated with the model's data plate of full size
``N``, gives ``ELBO_c = (N / n_c) sum_{i in c} E_i - KL``. Weighted ``n_c / N`` and summed over
the chunks (of every process)::

    sum_c (n_c / N) ELBO_c = sum_i E_i - KL sum_c n_c / N = ELBO,

the KL counted once, as in :mod:`pyro_dgp.train.distributed`. Each of the ``P`` particles is
one such sum, so the particles are independent estimates and their spread gives the standard
error as :func:`~pyro_dgp.evaluate_elbo` does.
"""

from __future__ import annotations

import torch

from ..datasets.stream import RowStream
from ..infer.objectives import ELBOEstimate, evaluate_elbo, one_particle_objective
from ..rng import seeded, step_seed
from ..validation import check_positive_int

__all__ = ["chunked_elbo", "fit_elbo"]


def _chunks(data, lo: int, hi: int, chunk_rows: int, dtype, device):
    """``(X_c, y_c)`` tensors of the rows ``[lo, hi)`` (a stream read in order: its own)."""
    if isinstance(data, RowStream):
        if data.random_access:
            parts = data.iterate(lo, hi, chunk_rows)
        else:
            parts = data.iterate(chunk_rows=chunk_rows)
        for X, y in parts:
            yield data.to_tensors(X, y, dtype, device)
        return
    X, y = data
    for start in range(lo, hi, chunk_rows):
        stop = min(start + chunk_rows, hi)
        yield X[start:stop], y[start:stop]


def chunked_elbo(model, guide, data, num_particles: int = 8, objective="auto", seed: int = 0,
                 parallel=None, chunk_rows: int = 4096, dtype: torch.dtype | None = None,
                 device=None) -> ELBOEstimate:
    """The ELBO of ``guide`` on ``data`` at the current parameters, read in chunks of
    ``chunk_rows`` rows (module docstring).

    :param data: ``(X (N, D), y (N,))`` tensors or a
        :class:`~pyro_dgp.datasets.stream.RowStream` (rows converted to ``dtype`` on
        ``device``, default float64 on the CPU).
    :param parallel: a :class:`~pyro_dgp.train.distributed.DataParallel`: each process reads
        its contiguous share of the rows (a stream read in order: its own rows) and the sums
        are added over the processes; every process gets the estimate.
    :param seed: the draws of chunk ``c`` of process ``r`` come from ``(seed, r, c)``; the
        global random state is left as it was.

    A model with a ``num_data`` attribute has it set to ``N``, as :func:`~pyro_dgp.fit` does.
    """
    num_particles = check_positive_int(num_particles, "num_particles")
    chunk_rows = check_positive_int(chunk_rows, "chunk_rows")
    N = data.num_data if isinstance(data, RowStream) else data[0].shape[-2]
    if isinstance(data, RowStream):
        dtype = torch.float64 if dtype is None else dtype
        device = torch.device("cpu" if device is None else device)
    else:
        dtype, device = data[0].dtype, data[0].device
    if hasattr(model, "num_data"):
        model.num_data = N
    rank = 0 if parallel is None else parallel.rank
    lo, hi = (0, N) if parallel is None else parallel.shard(N)
    elbo = one_particle_objective(objective, guide)
    totals = torch.zeros(num_particles, dtype=torch.float64)
    with torch.no_grad():
        for c, (X, y) in enumerate(_chunks(data, lo, hi, chunk_rows, dtype, device)):
            with seeded(step_seed(seed, c, rank), device):
                for p in range(num_particles):
                    totals[p] -= float(elbo.loss(model, guide, X, y)) * X.shape[-2] / N
    if parallel is not None:
        totals = parallel.sum(totals)
    return ELBOEstimate.from_values(totals.tolist())


def fit_elbo(model, guide, batches, num_particles: int, seed: int,
             parallel=None) -> ELBOEstimate:
    """The ELBO at the end of :func:`~pyro_dgp.fit` on its data (``batches``, a
    :class:`~pyro_dgp.train.batches.Batches`): :func:`~pyro_dgp.evaluate_elbo` on tensors in one
    process, else :func:`chunked_elbo`, each process over its share."""
    if batches.stream is None and parallel is None:
        return evaluate_elbo(model, guide, batches.X, batches.y, num_particles, "auto",
                             seed=seed)
    data = batches.stream if batches.stream is not None else (batches.X, batches.y)
    return chunked_elbo(model, guide, data, num_particles, seed=seed, parallel=parallel,
                        dtype=batches.dtype, device=batches.device)
