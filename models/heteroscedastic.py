"""Heteroscedastic regression with a deep GP: the last layer has two outputs, the mean and
the log noise scale, ``y_n ~ N(f_1(x_n), (s exp(f_2(x_n)))^2)`` (the heteroscedastic GP of
Goldberg, Williams and Bishop 1998 and Lazaro-Gredilla and Titsias 2011, here on top of
GP layers, as the chained GPs of Saul et al. 2016).

Sites: ``layer<l>.u``, ``layer<l>.f`` (the last one of width 2: ``[..., 0]`` the mean,
``[..., 1]`` the log noise scale) and the observation ``y``, scored by ``E log N(y | f_1,
s^2 e^{2 f_2})`` in closed form under the Gaussian of the guide's ``f`` (the analytic last
layer, :class:`~models.observations.HeteroscedasticNormal`); ``s`` is a learned scale
(``noise_scale``) so that ``f_2 = 0`` means a typical noise level. :func:`noise_std` gives
the posterior noise level.

Guides: every layer family (``MeanField``, ``Coupled``, ``Chain``, ``SemiImplicit``,
``complete(AutoX, model)``); ``Amortized`` with ``amortized=True``.
"""

from __future__ import annotations

import pyro
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from .observations import HeteroscedasticNormal
from .stack import StackModel, data_plate, function_draws

__all__ = ["HeteroscedasticDGP", "noise_std"]


class HeteroscedasticDGP(StackModel):
    """``y_n ~ N(f_1(x_n), (s exp f_2(x_n))^2)`` with ``f = f^L(... f^1(x))`` of width 2.

    :param X: ``(N, D)`` training inputs (initialisation; the model's dtype and device).
    :param hidden: widths of the inner layers; :param num_inducing: M per layer.
    :param noise_scale: initial ``s``; the default 1 is the scale of standardised ``y``
        (a smaller start makes the first steps' losses huge where ``q(f_2)`` is still wide).
    """

    def __init__(self, X: torch.Tensor, hidden: tuple[int, ...] = (1,),
                 num_inducing: int = 10, noise_scale: float = 1.0, amortized: bool = False):
        super().__init__(X, [X.shape[-1], *hidden, 2], num_inducing, amortized)
        self.noise_scale = PyroParam(X.new_tensor(noise_scale), constraints.positive)

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None):
        """:param X: ``(B, D)``; :param y: ``(B,)`` or ``None``."""
        plate = data_plate(self.num_data, X)
        f = self.propagate(X, plate)  # (..., B, 2): mean, log noise scale
        with plate:
            return pyro.sample("y", HeteroscedasticNormal(f, self.noise_scale), obs=y)


def noise_std(guide, X: torch.Tensor, num_samples: int = 64, seed: int | None = 0):
    """``(N,)`` posterior mean of the noise standard deviation ``s exp f_2(x_n)`` at ``X``
    from ``num_samples`` draws of a :class:`HeteroscedasticDGP`'s guide."""
    model = guide.model
    f = function_draws(guide, X, f"{model.layers[-1].name}.f", num_samples, seed)
    return model.noise_scale.detach() * f[..., 1].exp().mean(0)
