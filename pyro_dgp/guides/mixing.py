"""Semi-implicit conditionals and their entropy surrogates (Yin and Zhou 2018; Molchanova et
al. 2019).

A semi-implicit distribution mixes an explicit Gaussian over a noise variable that the
density never needs:

    q(u | c) = int N(u | mu(eps, c), Sigma(eps, c)) N(eps | 0, I) d eps,
    Sigma(eps, c) = T diag sigma(eps, c)^2 T^T,

with ``mu`` and ``sigma`` a neural network of the noise ``eps`` and of a conditioning value
``c`` (the layer below's inducing outputs in a deep GP), and ``T`` the identity (the diagonal
components of Yin and Zhou 2018 and Molchanova et al. 2019) or a learned unit lower-triangular
matrix per output, shared by all components (correlated components: every Gaussian, one
``T``, is such a component, so the family then contains the full-covariance Gaussian guide).
Its log-density is intractable; with ``u`` drawn from the component of ``eps_0`` and ``K``
further independent draws ``eps_1..eps_K``,

    log q_K(u | c) = log (1 / (K + 1)) sum_{k=0}^K N(u | mu(eps_k, c), Sigma(eps_k, c))

has ``E[log q_K] >= E[log q]``: its negative expectation is a lower bound on the entropy
that tightens as ``K`` grows (Yin and Zhou 2018; Molchanov et al. 2019), so in an ELBO it
gives an upper bound on ``E log q(u) - log p(u)`` and a lower bound on the evidence.

- Structured (SSIVI, Molchanova et al. 2019): a chain ``q(u^1) prod_l q(u^l | u^{l-1})`` of such
  conditionals, each with its own noise, takes the ``logsumexp`` over ``k`` per conditional.
- Plain SIVI over the same chain treats ``(eps^1, ..., eps^L)`` as one mixing variable and
  takes the ``logsumexp`` over ``k`` of the sum over the conditionals
  (:func:`surrogate_log_prob` of all components), which is looser: Theorem 1 of Molchanova
  et al. 2019, ``H >= H_SSIVI >= H_SIVI``.
- Importance-weighted (IWHVI, Sobolev and Vetrov 2019, their upper bound on ``log q(z)``):
  the ``K`` extra noises come from a learned reverse model ``tau(eps | u, c)`` (a Gaussian
  with diagonal covariance, :class:`ReverseNetwork`) instead of ``N(0, I)``, and every term,
  the drawing noise ``eps_0`` included, is weighted by ``N(eps_k | 0, I) / tau(eps_k | u, c)``:

      log q_K^IW(u | c) = log (1 / (K + 1)) sum_{k=0}^K N(u | mu(eps_k, c), Sigma(eps_k, c))
                                                        N(eps_k | 0, I) / tau(eps_k | u, c),

  with ``eps_0`` the noise that drew ``u`` (a draw of ``q(eps | u, c)``) and
  ``eps_1..eps_K ~ tau(. | u, c)``. ``E[log q_K^IW] >= log q(u | c)`` for every ``tau``,
  non-increasing in ``K``; ``tau = N(0, I)`` gives the SIVI surrogate above, and ``tau`` the
  exact ``q(eps | u, c)`` makes every term ``q(u | c)``, the bound exact at every ``K``.
- Discrete mixing (:class:`DiscreteMixingNormal`): ``eps`` uniform over ``K`` learned
  points, so ``q(u | c)`` is the equal-weight mixture of ``K`` Gaussians and its
  ``log q`` is exact (a ``logsumexp`` over the points).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_

from .gaussian import tril_matvec, unit_tril_solve

__all__ = ["DiscreteMixingNormal", "FanInLinear", "MixingNetwork", "ReverseNetwork",
           "SemiImplicitNormal", "surrogate_log_prob"]


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class FanInLinear(torch.nn.Linear):
    """``x (..., n_in) -> x W^T / n_in + b (..., n_out)``: ``torch.nn.Linear`` with its weight
    stored ``n_in`` times larger (PyTorch's initial function is unchanged).

    Why: Adam moves every parameter by about ``lr`` per step whatever its gradient's scale,
    so a plain linear layer summing ``n_in`` inputs can move each output by ``n_in * lr`` in
    one step, and a network of such layers compounds it. The mixing networks of a deep GP's
    semi-implicit guide have ``n_in`` in the hundreds or thousands (``vec u`` of a layer) and
    trained that way at the learning rates of the Gaussian guides, their scales left the
    prior's range within 25 steps and the loss became NaN. Dividing by the fan-in makes
    every output move by about ``lr`` per step, as the Gaussian guides' own parameters do
    (the mean-field parameterisation; Yang and Hu 2021 derive the Adam learning rates
    ``~ 1 / n_in`` it is equivalent to). torch has no such layer.
    """

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.weight.mul_(self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight / self.in_features, self.bias)


def _body(hidden: Sequence[int], n_out: int, like: dict) -> torch.nn.Sequential:
    """The layers after a network's first: LeakyReLU(0.2) then :class:`FanInLinear` layers
    through the widths ``hidden`` to ``n_out`` outputs, the last with zero weight (its output
    starts at its bias, whatever the input); ``like``: their dtype and device."""
    body: list[torch.nn.Module] = [torch.nn.LeakyReLU(0.2)]
    for a, b in zip(hidden[:-1], hidden[1:], strict=True):
        body += [FanInLinear(a, b, **like), torch.nn.LeakyReLU(0.2)]
    body.append(FanInLinear(hidden[-1], n_out, **like))
    with torch.no_grad():
        body[-1].weight.zero_()
    return torch.nn.Sequential(*body)


class MixingNetwork(PyroModule):
    """``(eps (..., noise_dim), c (..., cond_dim)) -> (loc, scale)``, each ``(..., D, M)``:
    a multilayer perceptron (LeakyReLU(0.2)) of the concatenation ``[eps; c]`` with two heads,
    the mean and the softplus of the scale. Its layers are :class:`FanInLinear`: under Adam
    each output moves by about ``lr`` per step, as a Gaussian guide's parameters do.

    The output layer starts at zero weight and at the biases ``init_loc`` and
    ``init_scale``: at the start the conditional is the Gaussian
    ``N(init_loc, diag init_scale^2)`` for every ``eps`` and ``c``, and training adds the
    mixing and the dependence on ``c``.

    :param noise_dim: the size of ``eps``; :param cond_dim: the size of ``c`` (0: none).
    :param hidden: the widths of the hidden layers (at least one).
    :param init_loc: ``(D, M)``; :param init_scale: ``(D, M)`` positive; their dtype and
        device are the network's.
    :param correlated: also learn :attr:`unit_tril`, the factor ``T`` of the module
        docstring (starts at the identity).
    :param num_points: also learn :attr:`points` ``(num_points, noise_dim)``, the support of
        a discrete mixing distribution (:class:`DiscreteMixingNormal`), drawn from
        ``N(0, I)`` at the start; ``None`` (default): no points.
    """

    def __init__(self, noise_dim: int, cond_dim: int, hidden: Sequence[int],
                 init_loc: torch.Tensor, init_scale: torch.Tensor, correlated: bool = False,
                 num_points: int | None = None):
        super().__init__()
        if not hidden:
            raise ValueError("MixingNetwork: hidden must hold at least one layer width")
        self.shape = tuple(init_loc.shape)
        n = init_loc.numel()
        like = {"dtype": init_loc.dtype, "device": init_loc.device}
        # the first layer on [eps; c] split in two, so W_c c is computed once for all K + 1
        # draws of eps that share c
        self.noise_in = FanInLinear(noise_dim, hidden[0], **like)
        self.cond_in = FanInLinear(cond_dim, hidden[0], bias=False, **like) if cond_dim \
            else None
        self.body = _body(hidden, 2 * n, like)
        with torch.no_grad():
            self.body[-1].bias.copy_(torch.cat([init_loc.reshape(n),
                                                _inverse_softplus(init_scale.reshape(n))]))
        D, M = self.shape
        # T's entries below the diagonal (those above are never read)
        self.tril_raw = torch.nn.Parameter(torch.zeros(D, M, M, **like)) if correlated \
            else None
        self.points = torch.nn.Parameter(torch.randn(num_points, noise_dim, **like)) \
            if num_points else None
        to_pyro_module_(self)

    @property
    def unit_tril(self) -> torch.Tensor | None:
        """``T (D, M, M)``, unit lower-triangular, shared by every component; ``None`` for
        diagonal components (``T = I``)."""
        raw = self.tril_raw
        if raw is None:
            return None
        return raw.tril(-1) + torch.eye(raw.shape[-1], dtype=raw.dtype, device=raw.device)

    def forward(self, eps: torch.Tensor, cond: torch.Tensor | None = None):
        """``eps (..., noise_dim)``, ``cond (..., cond_dim)`` broadcast against each other ->
        ``(loc, scale)``, each ``(..., D, M)``."""
        h = self.noise_in(eps)
        if self.cond_in is not None:
            if cond is None:
                raise ValueError("MixingNetwork: this network conditions on a value c; none "
                                 "was given")
            h = h + self.cond_in(cond)
        loc, raw = self.body(h).chunk(2, dim=-1)
        return loc.unflatten(-1, self.shape), torch.nn.functional.softplus(raw).unflatten(
            -1, self.shape)


class ReverseNetwork(PyroModule):
    """``(u (..., n_u), c (..., n_c)) -> (loc, scale)``, each ``(..., noise_dim)``: the
    reverse model ``tau(eps | u, c) = N(eps | loc, diag scale^2)`` of IWHVI (module
    docstring), a multilayer perceptron (LeakyReLU(0.2), :class:`FanInLinear` layers) of
    ``[u; c]``. Its output layer starts at zero weight and at ``loc = 0``, ``scale = 1``: at
    the start ``tau`` is the mixing distribution ``N(0, I)`` and the bound is SIVI's.

    :param value_dim: ``n_u``; :param cond_dim: ``n_c`` (0: none); :param noise_dim: the size
        of ``eps``; :param hidden: the hidden widths (at least one); :param like: a tensor
        whose dtype and device the parameters take.
    """

    def __init__(self, value_dim: int, cond_dim: int, noise_dim: int, hidden: Sequence[int],
                 like: torch.Tensor):
        super().__init__()
        if not hidden:
            raise ValueError("ReverseNetwork: hidden must hold at least one layer width")
        kw = {"dtype": like.dtype, "device": like.device}
        self.value_in = FanInLinear(value_dim, hidden[0], **kw)
        self.cond_in = FanInLinear(cond_dim, hidden[0], bias=False, **kw) if cond_dim else None
        self.body = _body(hidden, 2 * noise_dim, kw)
        with torch.no_grad():
            self.body[-1].bias.zero_()
            self.body[-1].bias[noise_dim:] = _inverse_softplus(torch.ones((), **kw))
        to_pyro_module_(self)

    def forward(self, value: torch.Tensor, cond: torch.Tensor | None = None):
        """``value (..., n_u)``, ``cond (..., n_c)`` broadcast -> ``(loc, scale)``, each
        ``(..., noise_dim)``."""
        h = self.value_in(value)
        if self.cond_in is not None:
            h = h + self.cond_in(cond)
        loc, raw = self.body(h).chunk(2, dim=-1)
        return loc, torch.nn.functional.softplus(raw)


def _log_normal(z: torch.Tensor, scale: torch.Tensor, dims) -> torch.Tensor:
    """``sum over dims of log N(z scale | 0, scale^2)``, ``z`` standardised."""
    return (-0.5 * z.square() - scale.log() - 0.5 * math.log(2 * math.pi)).sum(dims)


class SemiImplicitNormal(dist.TorchDistribution):
    """``q(u | c)`` of the module docstring, event shape ``(D, M)``, batch shape that of
    the Pyro plates around the site.

    ``rsample`` draws ``eps_0``, then ``u = mu(eps_0, c) + sigma(eps_0, c) z`` and keeps
    ``eps_0`` with its draw. ``log_prob(u)`` is the surrogate ``log q_K(u | c)`` with ``eps_0``
    that draw's noise; for any other value (replayed, or from elsewhere) all ``K + 1`` noises
    are fresh, an estimate with ``E <= log q(u | c)`` by Jensen's inequality.

    :param net: ``(eps (..., e), c (..., n_c) or None) -> (loc, scale)``, each
        ``(..., D, M)`` (a :class:`MixingNetwork` or any callable of that contract).
    :param cond: ``c (*batch_c, n_c)`` or ``None``, its batch dims broadcast with the site's.
    :param noise_dim: ``e``; :param num_mixing: ``K``, the extra noise draws of the surrogate.
    :param score: ``None`` for the surrogate of this conditional alone (SSIVI); else a
        callable ``(self, value) -> (*batch,)`` that scores the site instead (plain SIVI
        puts the joint surrogate of all conditionals at one site and zero at the others).
    :param on_draw: called as ``on_draw(self, value)`` after each ``rsample`` (a guide keeps
        the instance that drew, which Pyro's plates create by :meth:`expand`).
    :param like: a tensor whose dtype and device the noise takes (default: ``cond``'s, else
        those of ``net``'s parameters).
    :param unit_tril: ``T (D, M, M)`` unit lower-triangular, the components' shared factor
        (module docstring), or ``None`` for diagonal components.
    :param proposal: ``None`` (SIVI: the ``K`` extra noises from ``N(0, I)``) or IWHVI's
        reverse model, ``(vec u (..., D M), c or None) -> (loc, scale)`` each
        ``(..., noise_dim)`` (a :class:`ReverseNetwork`): the extra noises are drawn from it
        and every component weighted as in the module docstring.
    """

    arg_constraints: dict = {}
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(self, net: Callable, cond: torch.Tensor | None, noise_dim: int,
                 num_mixing: int, event_shape, batch_shape=(), score: Callable | None = None,
                 on_draw: Callable | None = None, like: torch.Tensor | None = None,
                 unit_tril: torch.Tensor | None = None, proposal: Callable | None = None):
        self.net, self.cond, self.noise_dim, self.num_mixing = net, cond, noise_dim, num_mixing
        self.score, self.on_draw, self.like, self.unit_tril = score, on_draw, like, unit_tril
        self.proposal = proposal
        # (value, eps_0, loc, scale, white = T^-1 (value - loc)) of the latest rsample
        self.own_draw: tuple | None = None
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape), validate_args=False)

    def expand(self, batch_shape, _instance=None):
        new = copy.copy(self)  # the same network, condition and settings; no draw yet
        new.own_draw = None
        dist.TorchDistribution.__init__(new, torch.Size(batch_shape), self.event_shape,
                                        validate_args=False)
        return new

    def _noise(self, shape) -> torch.Tensor:
        ref = self.like if self.like is not None else self.cond
        if ref is None and isinstance(self.net, torch.nn.Module):
            ref = next(self.net.parameters(), None)
        kw = {} if ref is None else {"dtype": ref.dtype, "device": ref.device}
        return torch.randn(tuple(shape) + (self.noise_dim,), **kw)

    def rsample(self, sample_shape=torch.Size()):
        shape = torch.Size(sample_shape) + self.batch_shape
        eps = self._noise(shape)
        loc, scale = self.net(eps, self.cond)
        white = scale * torch.randn_like(loc)
        value = loc + (white if self.unit_tril is None else tril_matvec(self.unit_tril, white))
        self.own_draw = (value, eps, loc, scale, white)
        if self.on_draw is not None:
            self.on_draw(self, value)
        return value

    def own_components(self, value: torch.Tensor):
        """``(loc, scale)`` of the component that drew ``value`` (``None`` where ``value``
        is not this distribution's latest draw)."""
        own = self.own_draw
        return (own[2], own[3]) if own is not None and value is own[0] else None

    def scale_tril(self, scale: torch.Tensor) -> torch.Tensor:
        """``(..., D, M, M)``: the Cholesky factor ``T diag(scale)`` of a component whose
        network scale is ``scale (..., D, M)``."""
        if self.unit_tril is None:
            return torch.diag_embed(scale)
        return self.unit_tril * scale.unsqueeze(-2)

    def component_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """``(*batch, K + 1)``: ``log N(value | mu(eps_k, c), Sigma(eps_k, c))`` over the
        event ``(D, M)`` (module docstring), with ``k = 0`` the noise that drew ``value``;
        with a :attr:`proposal`, the IWHVI log-weights, each plus
        ``log N(eps_k | 0, I) - log tau(eps_k | value, c)``."""
        batch = value.shape[:-2]
        if self.cond is not None:
            batch = torch.broadcast_shapes(batch, self.cond.shape[:-1])
        own = self.own_components(value) is not None
        fresh = self._noise(batch + (self.num_mixing + (not own),))
        if self.proposal is not None:  # eps_k ~ tau(. | value, c), (*batch, K (+ 1), e)
            tau_loc, tau_scale = self.proposal(value.flatten(-2), self.cond)
            tau_loc = tau_loc.expand(batch + tau_loc.shape[-1:]).unsqueeze(-2)
            tau_scale = tau_scale.expand(batch + tau_scale.shape[-1:]).unsqueeze(-2)
            fresh = tau_loc + tau_scale * fresh
        cond = None if self.cond is None else self.cond.unsqueeze(-2)  # over the K draws
        loc, scale = self.net(fresh, cond)  # (*batch, K or K + 1, D, M)

        def with_own(own_part, fresh_part):  # the drawing component first
            own_part = own_part.expand(batch + own_part.shape[-2:]).unsqueeze(-3)
            return torch.cat([own_part, fresh_part], -3)

        diagonal = self.unit_tril is None
        if own and diagonal:
            loc, scale = with_own(self.own_draw[2], loc), with_own(self.own_draw[3], scale)
        resid = value.unsqueeze(-3) - loc
        if not diagonal:  # T^-1 (u - mu_k), one solve over every fresh component
            resid = unit_tril_solve(self.unit_tril, resid)
            if own:  # the drawing component's T^-1 (u - mu_0) is its own noise: no solve
                resid = with_own(self.own_draw[4], resid)
                scale = with_own(self.own_draw[3], scale)
        log_n = _log_normal(resid / scale, scale, (-2, -1))  # log det T = 0
        if self.proposal is None:
            return log_n
        eps = fresh
        if own:
            own_eps = self.own_draw[1]
            eps = torch.cat([own_eps.expand(batch + own_eps.shape[-1:]).unsqueeze(-2), eps], -2)
        ones = torch.ones((), dtype=eps.dtype, device=eps.device)
        log_ratio = _log_normal(eps, ones, -1) - _log_normal((eps - tau_loc) / tau_scale,
                                                             tau_scale, -1)
        return log_n + log_ratio

    def log_prob(self, value):
        if self.score is not None:
            return self.score(self, value)
        return surrogate_log_prob([self.component_log_prob(value)])


class DiscreteMixingNormal(SemiImplicitNormal):
    """``q(u | c) = (1 / K) sum_k N(u | mu(p_k, c), Sigma(p_k, c))``: the semi-implicit
    conditional whose mixing distribution is uniform over ``K`` points ``p_k`` (the rows of
    ``points (K, noise_dim)``), an equal-weight mixture of ``K`` Gaussians. ``rsample``
    draws a point uniformly and then from its Gaussian (the weights are fixed, so the draw is
    reparameterised given the point); ``log_prob`` is the exact ``log q(u | c)``, a
    ``logsumexp`` over all ``K`` components for any value.

    :param points: ``(K, noise_dim)``, e.g. :attr:`MixingNetwork.points`; the other
        parameters as :class:`SemiImplicitNormal`'s (no ``num_mixing``: the sum is over the
        points, no proposal: the density is exact).
    """

    def __init__(self, net: Callable, cond: torch.Tensor | None, points: torch.Tensor,
                 event_shape, batch_shape=(), on_draw: Callable | None = None,
                 like: torch.Tensor | None = None, unit_tril: torch.Tensor | None = None):
        self.points = points
        super().__init__(net, cond, points.shape[-1], points.shape[0], event_shape,
                         batch_shape, on_draw=on_draw,
                         like=like if like is not None else points, unit_tril=unit_tril)

    def _noise(self, shape) -> torch.Tensor:
        """``shape + (noise_dim,)``: points drawn uniformly."""
        index = torch.randint(self.points.shape[0], tuple(shape), device=self.points.device)
        return self.points[index]

    def component_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """``(*batch, K)``: ``log N(value | mu(p_k, c), Sigma(p_k, c))`` over the event
        ``(D, M)``, for every point ``k``."""
        cond = None if self.cond is None else self.cond.unsqueeze(-2)  # over the K points
        loc, scale = self.net(self.points, cond)  # (*batch_c, K, D, M)
        resid = value.unsqueeze(-3) - loc
        if self.unit_tril is not None:
            resid = unit_tril_solve(self.unit_tril, resid)
        return _log_normal(resid / scale, scale, (-2, -1))


def surrogate_log_prob(components: Sequence[torch.Tensor]) -> torch.Tensor:
    """``log (1 / (K + 1)) sum_k exp(sum_j components[j][..., k])``: the surrogate of the
    product of conditionals whose ``(*batch, K + 1)`` component log-densities are given,
    their ``k``-th noises taken as one mixing variable; one conditional's own surrogate
    for a single entry (module docstring)."""
    total = components[0]
    for c in components[1:]:
        total = total + c
    return torch.logsumexp(total, -1) - math.log(total.shape[-1])
