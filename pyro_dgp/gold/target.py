"""The distribution the gold standard samples: the optimal ``q(U)`` of the deep GP's ELBO.

Every guide of the library pairs its ``q(U)`` with the model's own conditionals
``q(F | U) = p(F | U)``, so its ELBO is

    L(q) = E_q(U) [g(U)] - KL(q(U) || p(U)),   g(U) = E_{p(F | U)} log p(y | F),

and ``L(q) = log Z - KL(q(U) || q*(U))`` with

    q*(U) = p(U) exp(g(U)) / Z.

``q*`` is the best any guide over the inducing outputs can do, the common target of every
family, and its distance to a guide is what the ELBO charges the guide for. For one layer with
a Gaussian likelihood it is the collapsed optimum of Titsias (2009); for deeper models it is
non-Gaussian, may be multimodal, and couples the layers. The hyperparameters (kernels,
inducing inputs, mean functions, the likelihood's noise) are held at their current values.

``g(U)`` is computed, not estimated, so that a Hamiltonian sampler can use it: the likelihood
factorises over the points, so ``g = sum_i E log p(y_i | f^L_i)`` over the per-point
marginals of the layers' conditionals. Given ``U``, ``f^l_i`` is Gaussian given ``f^{l-1}_i``
(the model's conditional), so each expectation is a nested Gauss-Hermite quadrature over the
inner layers' values of the point (``Q`` nodes per inner output dimension, a tensor product
over dimensions), the last layer's expectation being the likelihood's own
(:meth:`~pyro_dgp.likelihoods.Likelihood.expected_log_prob`: closed form for a Gaussian).
The node count grows as ``Q^(D^1 + ... + D^{L-1})``: this is for small deep GPs (the toys of
Havasi et al. 2018 and Ustyuzhaninov et al. 2020 have one-dimensional inner layers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

from ..gp import DeepGP
from ..gp.layer import random_hyperparameters
from ..likelihoods import standard_normal_rule
from ..validation import check_inputs, check_positive_int, check_targets

__all__ = ["MAX_PATHS", "GoldTarget", "check_gold_model", "expected_log_likelihood",
           "fixed_hyperparameters", "num_paths"]

#: the largest number of quadrature paths per point (``Q^(sum of inner widths)``) allowed
MAX_PATHS = 20_000


def check_gold_model(model) -> None:
    """Refuse a model the gold standard cannot target, saying why.

    :raises TypeError: not a :class:`~pyro_dgp.DeepGP`.
    :raises ValueError: random inducing inputs (``inducing_scheme="propagated"``), a kernel
        per output (``outputs=``) or random hyperparameters (``PyroSample`` attributes), which
        its targets do not cover.
    """
    if not isinstance(model, DeepGP):
        raise TypeError(f"the gold standard needs a pyro_dgp.DeepGP, got {type(model).__name__}")
    if model.inducing_scheme != "per-layer":
        raise ValueError("the gold standard needs fixed inducing inputs "
                         "(inducing_scheme='per-layer'); this model has "
                         f"inducing_scheme={model.inducing_scheme!r}")
    per_output = [layer.name for layer in model.layers if layer.kernel_outputs]
    if per_output:
        raise ValueError("the gold standard needs each layer's kernel shared by its outputs; "
                         f"these layers have a kernel per output: {per_output}")
    random = list(random_hyperparameters(model))
    if random:
        raise ValueError("the gold standard holds the hyperparameters fixed; these modules of "
                         f"the model have random ones (PyroSample): {random}")


@contextlib.contextmanager
def fixed_hyperparameters(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Within the block, the model's parameters (kernels, inducing inputs, means, the
    likelihood's noise) take no gradient: a sampler's potential depends on ``U`` alone, and an
    optimiser over the model's and a guide's parameters (``fit``) trains the guide only.
    The parameters' ``requires_grad`` flags are restored afterwards."""
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield model
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)


def _hermite_grid(dim: int, num_points: int, like: torch.Tensor):
    """Tensor-product Gauss-Hermite rule for ``E g(z)``, ``z ~ N(0, I_dim)``: nodes
    ``(num_points^dim, dim)`` and log-weights ``(num_points^dim,)``."""
    nodes, log_w = standard_normal_rule(num_points, like.dtype, like.device)
    grids = torch.meshgrid(*([nodes] * dim), indexing="ij")
    log_ws = torch.meshgrid(*([log_w] * dim), indexing="ij")
    return (torch.stack([g.reshape(-1) for g in grids], -1),
            sum(lw.reshape(-1) for lw in log_ws))


def num_paths(model: DeepGP, num_quadrature: int) -> int:
    """Quadrature paths per point: ``num_quadrature`` to the sum of the inner widths."""
    return num_quadrature ** sum(layer.output_dim for layer in model.layers[:-1])


class GoldTarget:
    """``log q*(U) + log Z = log p(U) + g(U)`` of ``model`` at ``(X, y)``, for a sampler.

    Built with the hyperparameters held at their values now: each layer's prior ``p(u^l)``
    and the first layer's conditional at ``X``, which is affine in ``u^1``
    (``loc = c + A vec u^1``, ``var`` free of ``u^1``), are computed once, so an evaluation
    costs the inner layers' conditionals at the quadrature paths and the likelihood.

    :param model: a :class:`~pyro_dgp.DeepGP` with fixed inducing inputs.
    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets (the full data: no minibatch).
    :param num_quadrature: ``Q``, nodes per inner output dimension.
    :raises ValueError: the rule would need more than :data:`MAX_PATHS` paths per point.
    """

    def __init__(self, model: DeepGP, X: torch.Tensor, y: torch.Tensor,
                 num_quadrature: int = 20):
        check_gold_model(model)
        Q = check_positive_int(num_quadrature, "num_quadrature")
        check_inputs(X, model.input_dim)
        check_targets(y, X.shape[-2])
        if y.dtype != X.dtype or y.device != X.device:
            raise ValueError(f"y is {y.dtype} on {y.device} but X is {X.dtype} on {X.device}")
        if num_paths(model, Q) > MAX_PATHS:
            raise ValueError(
                f"the gold standard's quadrature needs {Q} ** (sum of the inner layers' "
                f"widths) = {num_paths(model, Q)} paths per point, over {MAX_PATHS}: use "
                "fewer num_quadrature nodes or a model with narrower inner layers")
        self.model, self.X, self.y, self.num_quadrature = model, X, y, Q
        self.names = [f"{layer.name}.u" for layer in model.layers]
        self.shapes = {f"{layer.name}.u": (layer.output_dim, layer.num_inducing)
                       for layer in model.layers}
        first = model.layers[0]
        D, M = self.shapes[self.names[0]]
        with torch.no_grad(), fixed_hyperparameters(model):
            self.priors = [layer.prior() for layer in model.layers]
            # the first layer's conditional at X is affine in u^1: its value at 0, and at the
            # unit vectors e_m (every output at once) less that, give c and A
            zero = X.new_zeros(D, M)
            self._c, self._var = first.conditional(X, zero)  # (N, D)
            basis = torch.eye(M, dtype=X.dtype, device=X.device).unsqueeze(-2).expand(M, D, M)
            self._A = (first.conditional(X, basis)[0] - self._c).permute(2, 1, 0)  # (D, N, M)
            self._nodes = [_hermite_grid(layer.output_dim, Q, X) for layer in model.layers[:-1]]
            # the later layers' inducing inputs are fixed too: their K_ZZ factors, once
            self._Lzz = [layer.kzz_cholesky() for layer in model.layers[1:]]

    def check(self, inducing: Mapping[str, torch.Tensor]) -> torch.Size:
        """The batch shape of ``inducing`` (``{"<layer>.u": (*batch, D_out, M)}``, every
        layer, one batch shape), or a ``ValueError`` naming the site that is off."""
        batch = None
        for name in self.names:
            if name not in inducing:
                raise ValueError(f"inducing has no value for the site '{name}' "
                                 f"(got {sorted(inducing)})")
            u, shape = inducing[name], self.shapes[name]
            if u.shape[-2:] != shape or (batch is not None and u.shape[:-2] != batch):
                raise ValueError(f"inducing['{name}'] must have shape (*batch, {shape[0]}, "
                                 f"{shape[1]}) with one batch shape for all layers, got "
                                 f"{tuple(u.shape)}")
            batch = u.shape[:-2]
        return batch

    def log_prior(self, inducing: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``sum_l log p(u^l)``."""
        return sum(p.log_prob(inducing[n]) for p, n in zip(self.priors, self.names, strict=True))

    def _last_layer_paths(self, inducing: Mapping[str, torch.Tensor]):
        """The last layer's Gaussian along every quadrature path: ``loc``, ``var``
        ``(*batch, P, N)`` and the paths' log-weights ``(P,)``."""
        layers = self.model.layers
        u1 = inducing[self.names[0]]
        # (*batch, 1 path, N, D): c + A u^1, and the first layer's variance
        loc = (self._c + (self._A @ u1.unsqueeze(-1)).squeeze(-1).mT).unsqueeze(-3)
        var = self._var
        log_w = self.X.new_zeros(1)
        for layer, name, (nodes, node_log_w), Lzz in zip(layers[1:], self.names[1:],
                                                         self._nodes, self._Lzz, strict=True):
            # the paths through the layer below: (*batch, P Q^D, N, D)
            h = loc.unsqueeze(-3) + var.clamp_min(0).sqrt().unsqueeze(-3) * nodes[:, None, :]
            h = h.flatten(-4, -3)
            log_w = (log_w[:, None] + node_log_w).reshape(-1)
            loc, var = layer.conditional(h, inducing[name].unsqueeze(-3), Lzz=Lzz)
        if len(layers) == 1:
            var = var.expand_as(loc)
        return loc.squeeze(-1), var.squeeze(-1), log_w

    def expected_log_likelihood(self, inducing: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``g(U)`` (module docstring) at ``inducing``, whose entries are
        ``(*batch, D_out, M)``, each layer's in its own (whitened or not) coordinates."""
        loc, var, log_w = self._last_layer_paths(inducing)
        ell = self.model.likelihood.expected_log_prob(self.y, loc, var)
        return (log_w.exp()[:, None] * ell).sum((-2, -1))

    def log_likelihood(self, inducing: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch, N)``: ``log p(y_n | U) = log E_{p(f_n | U)} p(y_n | f^L_n)`` per point,
        by the same quadrature (the per-point model's likelihood of a draw of ``U``)."""
        loc, var, log_w = self._last_layer_paths(inducing)
        lp = self.model.likelihood.predictive_log_prob(self.y, loc, var)
        return torch.logsumexp(log_w[:, None] + lp, -2)

    def log_density(self, inducing: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(*batch,)``: ``log p(U) + g(U) = log q*(U) + log Z``."""
        return self.log_prior(inducing) + self.expected_log_likelihood(inducing)


def expected_log_likelihood(model: DeepGP, X: torch.Tensor, y: torch.Tensor,
                            inducing: Mapping[str, torch.Tensor],
                            num_quadrature: int = 20) -> torch.Tensor:
    """``g(U) = sum_i E_{p(f_i | U)} log p(y_i | f^L_i)`` by nested Gauss-Hermite quadrature
    (module docstring), at the model's hyperparameters now.

    :param model: a :class:`~pyro_dgp.DeepGP` with fixed inducing inputs.
    :param X: ``(N, D)`` inputs; :param y: ``(N,)`` targets (the full data: no minibatch).
    :param inducing: ``{"<layer>.u": (*batch, D_out, M)}`` for every layer, in each layer's
        own (whitened or not) coordinates, with one batch shape for all layers.
    :param num_quadrature: ``Q``, nodes per inner output dimension.
    :returns: ``(*batch,)``.
    """
    target = GoldTarget(model, X, y, num_quadrature)
    target.check(inducing)
    return target.expected_log_likelihood(inducing)
