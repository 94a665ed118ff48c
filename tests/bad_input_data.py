"""Data the bad-input suites (``tests/*/test_bad_input.py``) share."""

import torch

import pyro_dgp as dgp

DT = torch.float64


def line_data():
    """``(X (20, 1), y (20,))``: float64 inputs evenly spaced on [-1, 1], targets ``sin(3 x)``."""
    X = torch.linspace(-1, 1, 20, dtype=DT).unsqueeze(-1)
    return X, torch.sin(3 * X.squeeze(-1))


def sine_data(N=60, D=1, dtype=DT, seed=0):
    """``(X (N, D), y (N,))`` in ``dtype``: standard normal inputs drawn in float64, targets
    ``sin(sum_d x_d)`` plus noise of standard deviation 0.1."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=DT)
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    return X.to(dtype), y.to(dtype)


def untrained_meanfield():
    """``(model, guide, X (60, 1), y (60,))``: ``DeepGP.regression`` on ``sine_data()`` with five
    inducing points and its ``MeanField`` guide, not trained."""
    X, y = sine_data()
    model = dgp.DeepGP.regression(X, y, num_inducing=5)
    return model, dgp.guides.MeanField(model), X, y
