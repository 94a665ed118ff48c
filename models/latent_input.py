"""A deep GP with latent inputs: the deep GP latent variable model (the GP-LVM of Lawrence
2005 and Titsias and Lawrence 2010, made deep by Damianou and Lawrence 2013), with an
amortized encoder ``q(x_n | y_n)`` (back-constraints, Lawrence and Quinonero-Candela 2006;
an inference network, Kingma and Welling 2014; Dai, Damianou, Gonzalez and Lawrence 2016).

Model: ``x_n ~ N(0, I_Q)`` in the data plate (site ``x``), then ``y_n`` from the decoder, a
:class:`~models.multi_output.MultiOutputDGP` of the latent inputs (sites ``layer<l>.u``,
``layer<l>.f``, ``y`` of event shape ``(P,)``).

Guide: :class:`LatentInputGuide` draws ``x_n ~ N(mu(y_n), diag sigma(y_n)^2)`` from an
encoder network, then runs a layer guide of the decoder at those inputs. So

    q(x, u, f) = prod_n q(x_n | y_n) q(u) p(f | u, x)     (f masked, as in every layer guide)

and the ELBO is ``E_q log p(y | f) - KL(q(x) || p(x)) - KL(q(u) || p(u))``. Every layer
family fits the decoder: ``MeanField(model.decoder)``, ``Coupled``, ``Chain``,
``SemiImplicit``, ``complete(AutoNormal, model.decoder)``, and
``Amortized`` with ``amortized=True`` (then the inducing points too are per point, amortized
on the latent inputs). Train with ``pyro.infer.SVI`` and ``Trace_ELBO``: ``model(y)``,
``guide(y)``.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_

from pyro_dgp.validation import unique_name

from .multi_output import MultiOutputDGP
from .neural import mlp
from .stack import data_plate

__all__ = ["LatentInputDGP", "LatentInputGuide"]


class LatentInputDGP(PyroModule):
    """``x_n ~ N(0, I_Q)``, ``y_n ~ decoder(x_n)``.

    :param Y: ``(N, P)`` observations (initialisation: the decoder's inducing inputs start
        at k-means centres of their standardised top ``Q`` principal components; the model's
        dtype and device).
    :param latent_dim: Q. Other arguments: those of the decoder,
        :class:`~models.multi_output.MultiOutputDGP`.
    """

    def __init__(self, Y: torch.Tensor, latent_dim: int = 1, hidden: tuple[int, ...] = (),
                 num_inducing: int = 10, noise_variance: float = 0.1,
                 amortized: bool = False):
        super().__init__(name=unique_name(type(self).__name__))
        if Y.dim() != 2:
            raise ValueError(f"LatentInputDGP: Y must be (N, P), got shape {tuple(Y.shape)}")
        if not isinstance(latent_dim, int) or not 1 <= latent_dim <= Y.shape[-1]:
            raise ValueError(f"LatentInputDGP: latent_dim must be an int in [1, "
                             f"{Y.shape[-1]}], got {latent_dim!r}")
        self.latent_dim = latent_dim
        centred = Y - Y.mean(0)
        _, _, Vh = torch.linalg.svd(centred, full_matrices=False)
        X0 = centred @ Vh[:latent_dim].mT
        X0 = X0 / X0.std(0)  # on the scale of the prior N(0, I)
        self.decoder = MultiOutputDGP(X0, Y.shape[-1], hidden, num_inducing,
                                      noise_variance, amortized)

    def forward(self, y: torch.Tensor):
        """:param y: ``(B, P)`` a minibatch of observations."""
        plate = data_plate(self.decoder.num_data, y)  # one plate: one subsample site
        with plate:
            x = pyro.sample("x", dist.Normal(y.new_zeros(self.latent_dim), 1.0).to_event(1))
        return self.decoder(x, y, plate)


class LatentInputGuide(PyroModule):
    """``q(x_n | y_n)`` by an encoder, then ``layer_guide`` (a layer guide of
    ``model.decoder``) at the drawn inputs.

    :param model: a :class:`LatentInputDGP`.
    :param layer_guide: a fresh layer guide built on ``model.decoder`` (any family).
    :param encoder: ``nn.Module`` ``(..., P) -> (..., 2 Q)`` (location, then the softplus
        pre-image of the scale); default a two-layer tanh network.
    """

    def __init__(self, model: LatentInputDGP, layer_guide, encoder: torch.nn.Module | None = None):
        super().__init__(name=unique_name(type(self).__name__))
        if getattr(layer_guide, "model", None) is not model.decoder:
            raise ValueError("LatentInputGuide: layer_guide must be built on model.decoder, "
                             "e.g. pyro_dgp.guides.MeanField(model.decoder)")
        Q, P = model.latent_dim, model.decoder.num_outputs
        ref = model.decoder.noise_variance.detach()
        encoder = mlp(P, 2 * Q) if encoder is None else encoder
        to_pyro_module_(encoder)
        self.encoder = encoder.to(dtype=ref.dtype, device=ref.device)
        self.layer_guide = layer_guide
        self._model = (model,)  # referenced, not registered: the guide's parameters only

    @property
    def model(self) -> LatentInputDGP:
        return self._model[0]

    def latent(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` of ``q(x_n | y_n)``, each ``(B, Q)``."""
        out = self.encoder(y)
        Q = self.model.latent_dim
        if out.shape[-1] != 2 * Q:
            raise ValueError(f"LatentInputGuide: the encoder must output 2 Q = {2 * Q} "
                             f"values per point, got shape {tuple(out.shape)}")
        return out[..., :Q], F.softplus(out[..., Q:]) + 1e-6

    def forward(self, y: torch.Tensor):
        loc, scale = self.latent(y)
        plate = data_plate(self.model.decoder.num_data, y)
        with plate:
            x = pyro.sample("x", dist.Normal(loc, scale).to_event(1))
        self.layer_guide(x, y, plate)  # q(u), then f given the drawn inputs
        return {"x": x}
