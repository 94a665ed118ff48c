"""Multi-output regression with a deep GP: ``P`` outputs read from one shared hidden
representation, ``y_n = f^L(h_n) + noise``, ``h_n = f^{L-1}(... f^1(x_n))`` (outputs
correlated through the shared inner layers, as in the multi-output deep GPs of Damianou and
Lawrence 2013 and Kaiser, Otte, Runkler and Ek 2018).

Sites: ``layer<l>.u``, ``layer<l>.f`` (the last one of width ``P``) and the observation ``y``
of event shape ``(P,)`` with one noise variance per output, scored by ``E log N(y | f, diag
noise)`` in closed form under the Gaussian of the guide's ``f`` (the analytic last layer,
:class:`~models.observations.DiagonalNormal`). :func:`predictive_mean` averages ``f^L`` over
guide draws.

It is also the decoder of the latent-input model (:mod:`models.latent_input`).

Guides: every layer family (``MeanField``, ``Coupled``, ``Chain``, ``SemiImplicit``,
``complete(AutoX, model)``); ``Amortized`` with ``amortized=True``.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from .observations import DiagonalNormal
from .stack import StackModel, data_plate, function_draws

__all__ = ["MultiOutputDGP", "predictive_mean"]


class MultiOutputDGP(StackModel):
    """``y_n ~ N(f^L(x_n), diag(noise_variance))``, ``f^L`` of width ``num_outputs``.

    :param X: ``(N, D)`` training inputs (initialisation; the model's dtype and device).
    :param num_outputs: P.
    :param hidden: widths of the inner layers; :param num_inducing: M per layer.
    :param noise_variance: initial noise variance of every output.
    """

    def __init__(self, X: torch.Tensor, num_outputs: int, hidden: tuple[int, ...] = (2,),
                 num_inducing: int = 10, noise_variance: float = 0.1,
                 amortized: bool = False):
        if not isinstance(num_outputs, int) or num_outputs < 1:
            raise ValueError(f"MultiOutputDGP: num_outputs must be a positive int, got "
                             f"{num_outputs!r}")
        super().__init__(X, [X.shape[-1], *hidden, num_outputs], num_inducing, amortized)
        self.noise_variance = PyroParam(X.new_full((num_outputs,), noise_variance),
                                        constraints.positive)

    @property
    def num_outputs(self) -> int:
        return self.layers[-1].output_dim

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None,
                plate: pyro.plate | None = None):
        """:param X: ``(B, D)``; :param y: ``(B, P)`` or ``None``; :param plate: the data
        plate of an enclosing model (:mod:`models.latent_input`); default a new one."""
        if y is not None and y.shape != (X.shape[-2], self.num_outputs):
            raise ValueError(f"MultiOutputDGP: y must have shape ({X.shape[-2]}, "
                             f"{self.num_outputs}), got {tuple(y.shape)}")
        plate = data_plate(self.num_data, X) if plate is None else plate
        f = self.propagate(X, plate)
        with plate:  # f: (..., B, P)
            return pyro.sample("y", DiagonalNormal(f, self.noise_variance.sqrt()), obs=y)


def predictive_mean(guide, X: torch.Tensor, num_samples: int = 64, seed: int | None = 0):
    """``(N, P)`` posterior mean of ``f^L`` at ``X`` (the predictive mean of ``y``) from
    ``num_samples`` draws of a :class:`MultiOutputDGP`'s guide."""
    site = f"{guide.model.layers[-1].name}.f"
    return function_draws(guide, X, site, num_samples, seed).mean(0)
