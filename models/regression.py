"""Regression with a deep GP: ``y = f^L(... f^1(x)) + noise`` (Salimbeni and Deisenroth 2017).

Sites: ``layer<l>.u`` (inducing outputs, ``(D_l, M)``), ``layer<l>.f`` (function values,
masked, in the data plate) for each layer, and the observation ``y`` in the data plate,
emitted by the Gaussian likelihood: under a guide that records the Gaussian of the last
layer's ``f`` it scores ``E log N(y | f, s^2)`` in closed form (the analytic last layer).

Guides: every layer family (``MeanField``, ``Coupled``, ``Chain``, ``SemiImplicit``,
``complete(AutoX, model)``); with ``amortized=True`` the layers are
``AmortizedGPLayer``\\ s and the guide is ``Amortized`` (trained with ``AmortizedELBO``).
``pyro_dgp.fit``, ``predict`` and ``to_datatree`` work on it as on a ``DeepGP``: it has
``.layers``, ``.likelihood``, ``num_data`` and ``example_args()``.
"""

from __future__ import annotations

import torch

import pyro_dgp as dgp

from .stack import StackModel, data_plate

__all__ = ["DGP", "RegressionDGP"]


class DGP(StackModel):
    """``y_n ~ likelihood(f^L(x_n))``, ``f^l`` GP layers of the widths ``D -> hidden ... -> 1``.

    :param X: ``(N, D)`` training inputs (initialisation; dtype and device of the model).
    :param likelihood: a single-output :class:`~pyro_dgp.likelihoods.Likelihood`.
    :param hidden: widths of the inner layers (``[]``: a single-layer sparse GP).
    :param num_inducing: M per layer.
    :param amortized: per-point inducing points (Meng and Zhang 2024) for the ``Amortized``
        guide.
    """

    def __init__(self, X: torch.Tensor, likelihood: dgp.likelihoods.Likelihood,
                 hidden: tuple[int, ...] = (1,), num_inducing: int = 10,
                 amortized: bool = False):
        super().__init__(X, [X.shape[-1], *hidden, 1], num_inducing, amortized)
        self.likelihood = likelihood.to(dtype=X.dtype, device=X.device)

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None):
        """:param X: ``(B, D)`` a minibatch; :param y: ``(B,)`` or ``None``."""
        plate = data_plate(self.num_data, X)
        f = self.propagate(X, plate)  # the last layer's f: (B, 1)
        with plate:
            return self.likelihood(f, y)  # the observation site "y"


class RegressionDGP(DGP):
    """:class:`DGP` with a Gaussian likelihood of initial variance ``noise_variance``."""

    def __init__(self, X: torch.Tensor, hidden: tuple[int, ...] = (1,),
                 num_inducing: int = 10, noise_variance: float = 0.1,
                 amortized: bool = False):
        super().__init__(X, dgp.likelihoods.Gaussian(X.new_tensor(noise_variance)), hidden,
                         num_inducing, amortized)
