"""Stacking weights: known answers on the simplex."""

import numpy as np
import pytest
import torch

from pyro_dgp.stacking import stacking_weights


def test_identical_candidates_get_equal_weights():
    col = torch.randn(50, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = stacking_weights(col.expand(50, 4))
    assert torch.allclose(w, torch.full((4,), 0.25, dtype=torch.float64), atol=1e-12)


def test_two_halves_each_fit_by_one_candidate_get_their_share():
    # candidate 0 explains 30 points, candidate 1 the other 70 (the other's density ~ 0 there):
    # the optimum of sum_n log(w_k p_k) is w = (0.3, 0.7) exactly in the limit
    lp = np.full((100, 2), -60.0)
    lp[:30, 0] = 0.0
    lp[30:, 1] = 0.0
    w = stacking_weights(lp)
    assert w.dtype == torch.float64
    assert torch.allclose(w, torch.tensor([0.3, 0.7], dtype=torch.float64), atol=1e-5)


def test_a_dominated_candidate_gets_no_weight_and_dtype_is_kept():
    lp = torch.zeros(40, 3, dtype=torch.float32)
    lp[:, 1] -= 5.0  # uniformly worse everywhere
    w = stacking_weights(lp)
    assert w.dtype == torch.float32 and abs(float(w.sum()) - 1) < 1e-6
    assert float(w[1]) < 1e-3


def test_objective_is_maximised():
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(80, 3, generator=g, dtype=torch.float64)
    w = stacking_weights(lp)

    def score(v):
        return float(torch.logsumexp(lp + v.log(), 1).sum())

    for _ in range(50):
        other = torch.distributions.Dirichlet(torch.ones(3, dtype=torch.float64)).sample()
        assert score(w) >= score(other) - 1e-9


@pytest.mark.parametrize("bad, match", [(torch.zeros(3), "shape"),
                                        (torch.tensor([[0.0, float("nan")]]), "column")])
def test_bad_input_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        stacking_weights(bad)
