"""The exact posterior of a small deep GP with its hyperparameters fixed, as a density for NUTS.

The model is the deep GP of Damianou and Lawrence (2013) augmented with inducing outputs
(Salimbeni and Deisenroth 2017, eq. 2): per layer ``l``, ``u^l = f^l(Z^l)`` (in the layer's
own whitened or unwhitened coordinates) and, given ``u^l`` and the layer's inputs ``H^{l-1}``
at the ``N`` training points (``H^0 = X``), the values ``f^l(H^{l-1})`` are jointly Gaussian
with the GP's conditional mean and full conditional covariance. Marginally over ``u`` this is
the deep GP's own prior, so the inducing inputs are only an augmentation and the posterior of
``f`` does not depend on them. (The Pyro model's ``<layer>.f`` site writes the per-point
marginals of that conditional, all the ELBO needs; its posterior would drop the correlations
between points. The ELBO's optimum ``q*(U)`` of :mod:`.target` is the same for both.)

Sampled: every layer's ``u^l`` and, for each inner layer, ``N x D_l`` standard normals
``e^l`` with

    f^l(H^{l-1}) = m^l(H^{l-1}) + A_l^T v^l + L_l e^l,     L_l L_l^T = Sigma_l + delta_l I,

``v^l = L_ZZ^-1 (f^l(Z) - m^l(Z))`` the whitened residual at ``Z``, ``A_l = L_ZZ^-1 K_ZH``,
``Sigma_l = K_HH - A_l^T A_l`` the conditional covariance and ``delta_l`` a jitter of
``default_jitter`` times the mean of ``diag K_HH`` (the conditional covariance is singular
where ``Z`` holds the inputs, as in the two-mode toy). That is the non-centred
parameterisation: the prior of ``(u, e)`` is free of the layers' inputs, which NUTS needs
where a centred ``f`` would couple its scale to the layer below (Papaspiliopoulos, Roberts and
Skold 2007).

The last layer's ``f`` is integrated out in closed form, its ``u`` kept: with a Gaussian
likelihood of variance ``s^2``, ``y | u^L, H^{L-1} ~ N(m^L(H) + A_L^T v^L, Sigma_L + s^2 I)``.
Keeping ``u^L`` (rather than integrating it out too, which gives the same posterior of the
inner layers) keeps the draws site for site those of a guide (every ``<layer>.u``, as the
ELBO-optimum target draws them), keeps something to sample in a one-layer model (whose exact
GP predictive then checks the sampler), and costs the same ``N x N`` Cholesky factor per
evaluation either way.

The predictive at test inputs conditions each layer on everything a draw fixes: with
``a_* = L_ZZ^-1 K_Z*`` and ``c_* = K_H* - A^T a_*`` (the conditional cross-covariance given
``u``), ``f(h_*)`` given ``u``, ``f(H)`` is Gaussian with

    mean = m(h_*) + a_*^T v + (L^-1 c_*)^T e,   var = k(h_*, h_*) - |a_*|^2 - |L^-1 c_*|^2,

where ``e`` is the draw's ``e^l`` for an inner layer and ``L^-1 (y - m(H) - A^T v)`` for the
last (the Gaussian conditional given the noisy ``y`` instead of ``f``): one formula.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pyro.distributions as dist
import torch

from ..gp import DeepGP
from ..likelihoods import Gaussian
from ..linalg import cholesky, default_jitter
from ..validation import check_inputs, check_targets
from .target import check_gold_model, fixed_hyperparameters

__all__ = ["MAX_POSTERIOR_POINTS", "PosteriorTarget"]

#: the most training points the posterior target takes: each evaluation factorises an
#: ``N x N`` matrix per layer, thousands of times per chain
MAX_POSTERIOR_POINTS = 1000

#: draws per batch of the predictive (its ``(S, N, N_*)`` solves bound the memory)
_CHUNK = 256


def white_site(layer_name: str) -> str:
    """The name of an inner layer's standard normals ``e^l`` at the training inputs."""
    return f"{layer_name}.f_white"


class PosteriorTarget:
    """``log p(U, E, y)`` of ``model`` at ``(X, y)`` (module docstring), for a sampler.

    :param model: a :class:`~pyro_dgp.DeepGP` with fixed inducing inputs, fixed
        hyperparameters, a :class:`~pyro_dgp.likelihoods.Gaussian` likelihood and a last layer
        of one output.
    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets (all of them).
    :raises ValueError: ``N`` over :data:`MAX_POSTERIOR_POINTS`, another likelihood, or a last
        layer of several outputs.

    :ivar names: the sampled sites: ``"<layer>.u"`` ``(D_out, M)`` of every layer, then
        ``"<layer>.f_white"`` ``(N, D_out)`` of every inner layer.
    :ivar priors: their priors, in that order.
    """

    def __init__(self, model: DeepGP, X: torch.Tensor, y: torch.Tensor):
        check_gold_model(model)
        check_inputs(X, model.input_dim)
        N = X.shape[-2]
        check_targets(y, N)
        if y.dtype != X.dtype or y.device != X.device:
            raise ValueError(f"y is {y.dtype} on {y.device} but X is {X.dtype} on {X.device}")
        if N > MAX_POSTERIOR_POINTS:
            raise ValueError(
                f"the posterior target factorises an N x N matrix per layer at every step; "
                f"N = {N} training points is over {MAX_POSTERIOR_POINTS}: use a subset of the "
                "data, or target='elbo_optimum' (whose cost is linear in N)")
        if not isinstance(model.likelihood, Gaussian):
            raise ValueError(
                "the posterior target integrates the last layer out in closed form, which "
                f"needs a Gaussian likelihood, not {type(model.likelihood).__name__}: use "
                "target='elbo_optimum'")
        if model.layers[-1].output_dim != 1:
            raise ValueError("the posterior target needs a last layer of one output, got "
                             f"{model.layers[-1].output_dim}")
        self.model, self.X, self.y = model, X, y
        layers = model.layers
        self.names = [f"{layer.name}.u" for layer in layers]
        self.names += [white_site(layer.name) for layer in layers[:-1]]
        with torch.no_grad(), fixed_hyperparameters(model):
            self.priors = [layer.prior() for layer in layers]
            self.priors += [dist.Normal(X.new_zeros(N, layer.output_dim), 1.0).to_event(2)
                            for layer in layers[:-1]]
            self._Lzz = [layer.kzz_cholesky() for layer in layers]
            self._noise = model.likelihood.variance.detach()
            # the first layer's inputs are the data: its parts are fixed
            self._first = self._layer(0, X, last=len(layers) == 1)

    # ------------------------------------------------------------------------ the layers
    def _whitened(self, i: int, u: torch.Tensor) -> torch.Tensor:
        """``(*batch, D, M)``: ``v = L_ZZ^-1 (f(Z) - m(Z))`` from layer ``i``'s ``u``."""
        layer, Lzz = self.model.layers[i], self._Lzz[i]
        if layer.whiten:
            return u
        if layer.function_values:
            u = u - layer.mean_function(layer.inducing_points).mT
        return torch.linalg.solve_triangular(Lzz, u.unsqueeze(-1), upper=False).squeeze(-1)

    def _layer(self, i: int, H: torch.Tensor, last: bool):
        """Layer ``i`` at its training inputs ``H`` ``(*batch, N, D_in)``: the mean function
        ``m(H)`` ``(*batch, N, D)``, ``A = L_ZZ^-1 K_ZH`` ``(*batch, M, N)`` and the factor
        ``L`` of ``Sigma + delta I`` (inner) or ``Sigma + s^2 I`` (last)."""
        layer, Lzz = self.model.layers[i], self._Lzz[i]
        Z = layer.inducing_points
        M = Z.shape[-2]
        # one kernel call for K_ZH and K_HH: each call reads the hyperparameters anew
        K = layer.kernel(torch.cat([Z.expand(H.shape[:-2] + Z.shape), H], -2))
        A = torch.linalg.solve_triangular(Lzz, K[..., :M, M:], upper=False)
        Khh = K[..., M:, M:]
        diag = Khh.diagonal(dim1=-2, dim2=-1)
        extra = self._noise if last else default_jitter(H.dtype) * diag.mean(-1)[..., None]
        cov = Khh - A.mT @ A + torch.diag_embed(extra.expand_as(diag))
        # the nugget is already in cov (jitter 0): more only where the factor fails, with a
        # warning, then CholeskyError naming the layer
        L = cholesky(cov, jitter=0.0, name=f"layer '{layer.name}' at the training inputs")
        return layer.mean_function(H), A, L

    def _forward(self, params: Mapping[str, torch.Tensor]):
        """Per layer ``(H, v, e, A, L)`` at the training inputs, ``e`` the draw's standard
        normals (inner) or the whitened residual ``L^-1 (y - m(H) - A^T v)`` (last)."""
        layers = self.model.layers
        H, out = self.X, []
        for i, layer in enumerate(layers):
            v = self._whitened(i, params[f"{layer.name}.u"])
            last = i == len(layers) - 1
            mH, A, L = self._first if i == 0 else self._layer(i, H, last)
            mean = mH + A.mT @ v.mT
            if last:
                e = torch.linalg.solve_triangular(L, self.y.unsqueeze(-1) - mean, upper=False)
            else:
                e = params[white_site(layer.name)]
            out.append((H, v, e, A, L))
            H = mean + L @ e
        return out

    # ------------------------------------------------------------------------ densities
    def log_prior(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``sum_l log p(u^l) + sum_inner log N(e^l; 0, I)``."""
        return sum(p.log_prob(params[n]) for p, n in zip(self.priors, self.names, strict=True))

    def log_likelihood(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``log N(y; m^L(H) + A^T v^L, Sigma_L + s^2 I)``."""
        *_, e, _, L = self._forward(params)[-1]
        N = e.shape[-2]
        return (-0.5 * e.square().sum((-2, -1)) - L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                - 0.5 * N * math.log(2 * math.pi))

    def log_density(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``log p(U, E) + log p(y | U, E)``, the log posterior up to a
        constant."""
        return self.log_prior(params) + self.log_likelihood(params)

    def loo_log_likelihood(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch, N)``: ``log p(y_n | y_-n, U, E)``, the leave-one-out conditionals of the
        draws' joint Gaussian of ``y`` (Burkner, Gabry and Vehtari 2021): with ``C`` the
        inverse covariance and ``g = C r``, ``y_n | y_-n`` has mean ``y_n - g_n / C_nn`` and
        variance ``1 / C_nn``."""
        *_, e, _, L = self._forward(params)[-1]
        C = torch.cholesky_inverse(L)
        g = torch.linalg.solve_triangular(L.mT, e, upper=True).squeeze(-1)  # C r
        c = C.diagonal(dim1=-2, dim2=-1)
        return 0.5 * c.log() - 0.5 * g.square() / c - 0.5 * math.log(2 * math.pi)

    # ------------------------------------------------------------------------ predictive
    def _conditional(self, i: int, h: torch.Tensor, part) -> tuple[torch.Tensor,
                                                                    torch.Tensor]:
        """``(loc, var)`` ``(S, N_*, D)`` of layer ``i`` at ``h`` ``(S, N_*, D_in)`` given a
        draw's training part (module docstring's formula)."""
        layer, Lzz = self.model.layers[i], self._Lzz[i]
        H, v, e, A, L = part
        a = torch.linalg.solve_triangular(Lzz, layer.kernel(layer.inducing_points, h),
                                          upper=False)  # (S, M, N_*)
        B = torch.linalg.solve_triangular(L, layer.kernel(H, h) - A.mT @ a, upper=False)
        loc = layer.mean_function(h) + a.mT @ v.mT + B.mT @ e
        var = layer.kernel(h, diag=True) - a.square().sum(-2) - B.square().sum(-2)
        return loc, var.clamp_min(0).unsqueeze(-1).expand_as(loc)

    def propagate(self, draws: Mapping[str, torch.Tensor], X: torch.Tensor, stop: int,
                  keep_last_gaussian: bool) -> torch.Tensor | tuple[torch.Tensor,
                                                                     torch.Tensor]:
        """Draws of layer ``stop``'s ``f`` at ``X`` ``(S, N_*, D)``, one per draw of
        ``draws`` (``{site: (S, *event)}``), the layers below drawn per point from their
        conditionals; or layer ``stop``'s ``(loc, var)`` with ``keep_last_gaussian``. Uses
        torch's global random state (the caller seeds it)."""
        S = next(iter(draws.values())).shape[0]
        out = []
        for lo in range(0, S, _CHUNK):
            chunk = {k: v[lo:lo + _CHUNK] for k, v in draws.items()}
            parts = self._forward(chunk)
            h = X.expand(next(iter(chunk.values())).shape[0], *X.shape)
            for i in range(stop + 1):
                loc, var = self._conditional(i, h, parts[i])
                if i == stop and keep_last_gaussian:
                    break
                h = loc + var.sqrt() * torch.randn_like(loc)
            out.append((loc, var) if keep_last_gaussian else h)
        if keep_last_gaussian:
            return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        return torch.cat(out)
