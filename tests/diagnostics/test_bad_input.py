"""The diagnostics' entry points (``to_datatree``, ``layer_summary``) given bad input, beside the
other entry points that refuse the same input."""


import pytest
import torch

import pyro_dgp as dgp

DT = torch.float64


def _data(N=60, D=1, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=DT)
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    return X.to(dtype), y.to(dtype)


@pytest.fixture
def fitted():
    X, y = _data()
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    return model, dgp.guides.MeanField(model), X, y


def test_zero_rows_are_refused_at_every_entry_point(fitted):
    model, guide, X, y = fitted
    dgp.fit(model, guide, X, y, num_steps=1, progress=False, final_elbo_particles=0)
    match = r"X has no rows \(shape \(0, 1\)\): at least one data point is needed"
    for call in (lambda: dgp.predict(model, guide, X[:0]),
                 lambda: dgp.layer_summary(dgp.to_datatree(model, guide, X[:0])),
                 lambda: dgp.to_datatree(model, guide, X[:0]),
                 lambda: dgp.fit(model, guide, X[:0], y[:0], num_steps=1, progress=False),
                 lambda: dgp.DeepGP.regression(X[:0], y[:0])):
        with pytest.raises(ValueError, match=match):
            call()
