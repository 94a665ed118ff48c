"""Classification with a deep GP: binary (Bernoulli-probit) and multiclass (softmax).

``ProbitDGP``: ``p(y_n = 1) = Phi(f^L(x_n))`` (the probit link of Rasmussen and Williams
2006, §3.3, in a deep GP as Salimbeni and Deisenroth 2017). Sites ``layer<l>.u``,
``layer<l>.f`` and the observation ``y`` (labels 0/1, float). The likelihood scores ``E log
Phi(+-f)`` under the Gaussian of the last layer's ``f`` by Gauss-Hermite (the analytic last
layer); ``pyro_dgp.predict`` gives ``p(y = 1)`` as the predictive mean.

``MulticlassDGP``: ``p(y_n = k) = softmax(f^L(x_n))_k``, one GP output per class in the last
layer. Sites ``layer<l>.u``, ``layer<l>.f`` and ``y`` (labels ``0 ... K-1``). The observation
scores ``log softmax`` at the guide's draw of ``f`` (a Monte Carlo estimate of ``E log
p(y | f)``, unbiased; no quadrature over ``K`` dimensions); :func:`class_probabilities`
averages ``softmax(f)`` over guide draws.

Guides: every layer family (``MeanField``, ``Coupled``, ``Chain``, ``SemiImplicit``,
``complete(AutoX, model)``); ``Amortized`` with ``amortized=True``.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch

import pyro_dgp as dgp

from .regression import DGP
from .stack import StackModel, data_plate, function_draws

__all__ = ["MulticlassDGP", "ProbitDGP", "class_probabilities"]


class ProbitDGP(DGP):
    """:class:`~models.regression.DGP` with the Bernoulli-probit likelihood."""

    def __init__(self, X: torch.Tensor, hidden: tuple[int, ...] = (1,),
                 num_inducing: int = 10, amortized: bool = False):
        super().__init__(X, dgp.likelihoods.BernoulliProbit(), hidden, num_inducing,
                         amortized)


class MulticlassDGP(StackModel):
    """``y_n ~ Categorical(softmax(f^L(x_n)))``, ``f^L`` with ``num_classes`` outputs.

    :param X: ``(N, D)`` training inputs (initialisation; the model's dtype and device).
    :param num_classes: K >= 2.
    :param hidden: widths of the inner layers; :param num_inducing: M per layer.
    """

    def __init__(self, X: torch.Tensor, num_classes: int, hidden: tuple[int, ...] = (2,),
                 num_inducing: int = 10, amortized: bool = False):
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"MulticlassDGP: num_classes must be an int >= 2, got "
                             f"{num_classes!r}")
        super().__init__(X, [X.shape[-1], *hidden, num_classes], num_inducing, amortized)
        self.num_classes = num_classes

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None):
        """:param X: ``(B, D)``; :param y: ``(B,)`` labels ``0 ... K-1`` (whole numbers, in
        ``X``'s floating dtype as ``pyro_dgp.fit`` passes them, or integers) or ``None``."""
        if y is not None and not bool(((y >= 0) & (y < self.num_classes) & (y == y.round()))
                                      .all()):
            raise ValueError(f"MulticlassDGP: y must hold class labels 0 ... "
                             f"{self.num_classes - 1}")
        plate = data_plate(self.num_data, X)
        f = self.propagate(X, plate)
        with plate:  # f: (..., B, K) logits
            return pyro.sample("y", dist.Categorical(logits=f), obs=y)


def class_probabilities(guide, X: torch.Tensor, num_samples: int = 64,
                        seed: int | None = 0) -> torch.Tensor:
    """``(N, K)`` predictive class probabilities ``E_q softmax(f^L(x_n))`` of a
    :class:`MulticlassDGP`'s guide, averaged over ``num_samples`` draws."""
    layer = guide.model.layers[-1].name
    f = function_draws(guide, X, f"{layer}.f", num_samples, seed)  # (S, N, K)
    return f.softmax(-1).mean(0)
