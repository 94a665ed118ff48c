"""A deep GP on a neural feature map: ``y_n = f^L(... f^1(g(x_n))) + noise`` with ``g`` an
``nn.Module`` (deep kernel learning, Wilson, Hu, Salakhutdinov and Xing 2016, with GP layers
on top). ``g``'s weights are point-estimated by the same SVI steps as the kernels (they are
model parameters, not latent sites: no guide needs to know them).

Sites: ``layer<l>.u``, ``layer<l>.f`` and the observation ``y`` (Gaussian likelihood, the
analytic last layer). ``pyro_dgp.fit`` and ``predict`` work on it: it has ``.layers``,
``.likelihood``, ``num_data`` and ``example_args()``.

Guides: every layer family; the feature map is a fixed function of ``x`` as far as the
guides are concerned.
"""

from __future__ import annotations

import torch
from pyro.nn.module import to_pyro_module_

import pyro_dgp as dgp

from .stack import StackModel, data_plate

__all__ = ["FeatureDGP", "mlp"]


def mlp(input_dim: int, output_dim: int, width: int = 32) -> torch.nn.Module:
    """A two-layer tanh network ``(..., input_dim) -> (..., output_dim)``."""
    return torch.nn.Sequential(torch.nn.Linear(input_dim, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, output_dim))


class FeatureDGP(StackModel):
    """``y_n ~ N(f^L(g(x_n)), noise)``, ``g`` an ``nn.Module`` ``(..., D) -> (..., F)``.

    :param X: ``(N, D)`` training inputs (initialisation: the layers' inducing inputs start
        at k-means centres of ``g(X)``; the model's dtype and device).
    :param features: the feature map ``g`` (default :func:`mlp` to ``feature_dim``); moved to
        ``X``'s dtype and device.
    :param hidden: widths of the inner GP layers; :param num_inducing: M per layer.
    """

    def __init__(self, X: torch.Tensor, features: torch.nn.Module | None = None,
                 feature_dim: int = 2, hidden: tuple[int, ...] = (),
                 num_inducing: int = 10, noise_variance: float = 0.1):
        g = mlp(X.shape[-1], feature_dim) if features is None else features
        if not isinstance(g, torch.nn.Module):
            raise TypeError(f"FeatureDGP: features must be a torch.nn.Module, got "
                            f"{type(g).__name__}")
        g = g.to(dtype=X.dtype, device=X.device)
        with torch.no_grad():
            H = g(X)
        if H.dim() != 2 or H.shape[0] != X.shape[0]:
            raise ValueError(f"FeatureDGP: features must map (N, D) to (N, F), got "
                             f"{tuple(H.shape)} for X of shape {tuple(X.shape)}")
        super().__init__(H, [H.shape[-1], *hidden, 1], num_inducing)
        to_pyro_module_(g)  # its weights become Pyro parameters (learned, not latent)
        self.features = g
        self.input_dim = X.shape[-1]
        self.likelihood = dgp.likelihoods.Gaussian(X.new_tensor(noise_variance))

    def example_args(self) -> tuple[torch.Tensor]:
        Z = self.layers[0].inducing_points.detach()
        return (Z.new_zeros(1, self.input_dim),)

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None):
        """:param X: ``(B, D)``; :param y: ``(B,)`` or ``None``."""
        plate = data_plate(self.num_data, X)
        h = self.features(X)  # (B, F): a deterministic map, learned by SVI as parameters
        f = self.propagate(h, plate)
        with plate:
            return self.likelihood(f, y)
