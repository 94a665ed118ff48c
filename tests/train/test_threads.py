"""Thread count by problem size: one thread for small fits, restored after."""

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp.train.threads import (
    PARALLEL_WORK,
    available_cores,
    num_threads,
    step_work,
    threads_for,
)


def test_step_work_counts_the_quadratic_forms():
    X = torch.randn(30, 3, dtype=torch.float64)
    y = X[:, 0].clone()
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=7, hidden_dim=3)
    # P B (D_1 M^2 + D_2 M^2) = 2 * 16 * (3 * 49 + 1 * 49)
    assert step_work(model, 16, 2) == 2 * 16 * (3 + 1) * 49


def test_threads_for_small_and_large_work():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(available_cores())
        assert threads_for(0) == 1
        assert threads_for(PARALLEL_WORK - 1) == 1
        assert threads_for(PARALLEL_WORK) == min(2, available_cores())
        assert threads_for(1e6 * PARALLEL_WORK) == available_cores()
        torch.set_num_threads(1)  # a process that asked for one thread keeps one
        assert threads_for(1e6 * PARALLEL_WORK) == 1
    finally:
        torch.set_num_threads(before)


def test_num_threads_sets_and_restores_and_refuses_bad_counts():
    before = torch.get_num_threads()
    with num_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with num_threads(None):
        assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            with num_threads(bad):
                pass


class _Recording(dgp.DeepGP):
    seen: list = []

    def forward(self, *args, **kwargs):
        _Recording.seen.append(torch.get_num_threads())
        return super().forward(*args, **kwargs)


def test_fit_runs_small_problems_on_one_thread_and_restores_the_count():
    X = torch.linspace(-1, 1, 20, dtype=torch.float64)[:, None]
    y = torch.sin(3 * X[:, 0])
    base = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=5)
    model = _Recording(list(base.layers), base.likelihood)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pyro.clear_param_store()
        _Recording.seen.clear()
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=2, progress=False,
                final_elbo_particles=0)
        assert set(_Recording.seen) == {1}
        assert torch.get_num_threads() == 2
        _Recording.seen.clear()
        dgp.fit(model, dgp.guides.MeanField(model), X, y, num_steps=2, progress=False,
                final_elbo_particles=0, threads=2)
        assert set(_Recording.seen) == {2}
    finally:
        torch.set_num_threads(before)
