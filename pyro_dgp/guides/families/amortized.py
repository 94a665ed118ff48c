"""Amortized guides of deep GPs with input-dependent inducing points (AVDGP: Meng and Zhang
2024), for models of :class:`~pyro_dgp.gp.amortized.AmortizedGPLayer`.

An encoder maps a summary ``P(F_n^{l-1})`` of each point's input to layer ``l`` to
``q(u_n^l) = N(mu_n, Sigma_n)`` (whitened ``u``), and the inducing inputs are ``A(P(F_n^{l-1}))``.
A run draws ``S`` paths per point (the paths are the plate at dim -2 of the run: Pyro's
vectorised particles, :class:`~pyro_dgp.infer.amortized.AmortizedELBO`'s plate, or the draws
of ``predict``; one path without such a plate). Rules:

- ``AR1``: ``P(F) = F``, each path's own ``q(u)``.
- ``AR2``: ``P(F) = E[F]``, estimated by the mean of the paths' conditional means, one
  ``q(u_n)`` shared by the paths.
- ``AR2P``: ``AR2`` with the Gaussian noise of the draws replaced by learnable quadrature
  nodes: path ``s`` takes ``F_s = m_s + xi_s sqrt(v_s)`` with ``xi_s = 5 (2 sigmoid(a_s) - 1)``
  per layer and output, weight ``omega = softmax(w)`` shared by the layers, and
  ``E[F] = sum_s omega_s m_s``. Under ``AmortizedELBO`` the run's paths are the ``S`` nodes
  and the objective weighs them by ``omega``; so does ``predict``, whose mixture is over the
  ``S`` nodes with weights ``omega`` (:meth:`Amortized.weighted_paths`). Under any other plate
  of ``P`` draws (or none), the draws pick their nodes by systematic resampling from
  ``omega``: a Monte Carlo estimate of the weighted sums (``omega`` then gets no gradient).
- ``AR2PP``: ``AR2P`` trained with the predictive objective
  ``log sum_s omega_s N(y_n | m_s, v_s + sigma^2) - beta KL`` (``AmortizedELBO``).

Estimator: ``f^l`` of each path is drawn from the collapsed marginal of ``f(x)`` with
``u_n`` integrated out (Salimbeni and Deisenroth 2017), exact since ``q(u_n)`` is Gaussian
given the path's input and the summary, and the last layer's Gaussian goes to the likelihood
(analytic for a Gaussian likelihood). The KL of each ``u_n`` to ``N(0, I)`` is closed form,
so ``mean_field`` is true: ``AnalyticKL_ELBO`` (``fit``'s ``"auto"``) and ``Trace_ELBO`` are
valid, with uniform weights over their draws.

Each ``<layer>.u`` site of a run carries ``q(u_n)`` as a :class:`LocalGaussian`, which also
holds the inducing inputs ``Z_n = A(P(F_n))`` that ``u_n`` was placed at (exported by
``to_datatree``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyro.distributions as dist
import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, PyroParam
from pyro.poutine.plate_messenger import PlateMessenger
from pyro.poutine.runtime import _PYRO_STACK
from torch.distributions import register_kl

from ...gp.distributions import FunctionMarginal, WhitenedPrior
from ...gp.kl import standard_normal_kl
from ...likelihoods.marginal import SourceGaussian, record_source, source_of
from ...state import swapped
from ...validation import check_positive_finite, check_positive_int
from ..base import GuideRun, LayerGuide
from ..encoders import MLPEncoder, as_pyro_module, check_encoded
from ..params import copy_into, deep_getattr
from ..prototype import LayerSite
from ..registry import register_guide

__all__ = ["PATH_PLATE", "RULES", "Amortized", "LocalGaussian", "QuadratureMarginal"]

#: the plate over the ``S`` paths that ``AmortizedELBO`` opens (dim -2)
PATH_PLATE = "_amortized_paths"
RULES = ("AR1", "AR2", "AR2P", "AR2PP")
_NODE_BOUND = 5.0


@dataclass
class AmortizedRun(GuideRun):
    """One run: its paths ``P`` (``None``: no path plate), whether they are the ``S``
    quadrature nodes (``exact``), the node index of each path, and ``q`` by layer."""

    paths: int | None = None
    exact: bool = False
    index: torch.Tensor | None = None
    q: dict = field(default_factory=dict)


class LocalGaussian(dist.Independent):
    """``q(u_n)``: batch ``(..., N)``, event ``(D_out, M)``, a Gaussian per output with
    ``loc (..., N, D_out, M)`` and ``scale``: a Cholesky factor ``(..., N, D_out, M, M)`` or
    the standard deviations ``(..., N, D_out, M)`` of a diagonal covariance (kept diagonal:
    its KL and the conditional then cost ``M`` times less than with ``diag_embed``),
    together with the inducing inputs ``inducing_inputs (..., N, M, D_in)`` at which ``u_n``
    is defined."""

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor,
                 inducing_inputs: torch.Tensor, validate_args=None):
        if scale.dim() == loc.dim():
            per_output = dist.Normal(loc, scale).to_event(1)
        else:
            per_output = dist.MultivariateNormal(loc, scale_tril=scale)
        super().__init__(per_output, 1, validate_args=validate_args)
        self.inducing_inputs = inducing_inputs
        #: ``(loc, scale)`` as given, kept unexpanded by :meth:`expand`
        self.point_parameters = (loc, scale)

    def expand(self, batch_shape, _instance=None):
        # The expanded Gaussian keeps the unexpanded Cholesky factor (MultivariateNormal's
        # expand does): its KL and log-density then work on (..., N, D_out, M, M) once, not
        # once per path of the S paths around the site (S times the memory and time).
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(LocalGaussian, _instance)
        base = self.base_dist.expand(batch_shape + self.base_dist.batch_shape[-1:])
        dist.Independent.__init__(new, base, 1, validate_args=False)
        new._validate_args = self._validate_args
        Z = self.inducing_inputs
        new.inducing_inputs = Z.expand(batch_shape + Z.shape[-2:])
        new.point_parameters = self.point_parameters
        return new


@register_kl(LocalGaussian, WhitenedPrior)
def _kl_local_to_whitened_prior(p: LocalGaussian, q: WhitenedPrior) -> torch.Tensor:
    """``KL(q(u_n) || N(0, I))`` of each point from its own parameters, then expanded over
    the batch: the ``S`` paths around a site share ``q(u_n)``, so it is evaluated once."""
    if p.event_shape != q.event_shape:
        raise ValueError(f"KL(q(u) || p(u)): q's event shape {tuple(p.event_shape)} is not "
                         f"p's {tuple(q.event_shape)}")
    loc, scale = p.point_parameters
    if scale.dim() == loc.dim():  # diagonal: 0.5 (s^2 + m^2 - 1) - log s, summed over M
        kl = (0.5 * (scale.square() + loc.square() - 1) - scale.log()).sum(-1)
    else:
        kl = standard_normal_kl(loc, scale)
    kl = kl.sum(-1)  # (..., N): summed over D_out
    return kl.expand(torch.broadcast_shapes(p.batch_shape, q.batch_shape))


class QuadratureMarginal(FunctionMarginal):
    """``N(loc, var)`` whose draw is ``loc + nodes sqrt(var)`` (fixed nodes, no noise); the
    Gaussian is recorded as the draw's source as for :class:`FunctionMarginal`."""

    def __init__(self, loc: torch.Tensor, var: torch.Tensor, nodes: torch.Tensor):
        super().__init__(loc, var)
        self.nodes = nodes

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("quadrature paths are one draw per batch entry")
        loc = self.base_dist.loc
        value = loc + self.nodes * self.var.sqrt()
        record_source(value, SourceGaussian(loc, self.var))
        return value

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape) + self.event_shape
        return QuadratureMarginal(self.base_dist.loc.expand(shape), self.var.expand(shape),
                                  self.nodes)


def _path_plate() -> tuple[str | None, int | None]:
    """``(name, size)`` of the innermost active plate at dim -2, or ``(None, None)``."""
    for m in reversed(_PYRO_STACK):
        if isinstance(m, PlateMessenger) and m.dim == -2:
            return m.name, m.size
    return None, None


def _systematic(weights: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` indices drawn from ``weights (S,)`` by systematic resampling."""
    start = torch.rand((), dtype=weights.dtype, device=weights.device)
    points = (start + torch.arange(n, dtype=weights.dtype, device=weights.device)) / n
    cdf = weights.cumsum(0)
    return torch.searchsorted(cdf, points.clamp_max(cdf[-1])).clamp_max(weights.shape[0] - 1)


def _node_logits(nodes: torch.Tensor) -> torch.Tensor:
    """Inverse of ``xi = 5 (2 sigmoid(a) - 1)``."""
    return torch.logit((nodes / _NODE_BOUND + 1) / 2)


def _initial_nodes(S: int, D: int, dtype, device) -> torch.Tensor:
    """``(S, D)``: normal quantiles at ``(s - 1/2) / S``, independently permuted per output
    (a Latin hypercube over the outputs), within the nodes' bounds."""
    q = torch.special.ndtri((torch.arange(S, dtype=torch.float64) + 0.5) / S)
    gen = torch.Generator().manual_seed(S * 1009 + D)
    cols = [q[torch.randperm(S, generator=gen)] for _ in range(D)]
    nodes = torch.stack(cols, -1).clamp(-0.98 * _NODE_BOUND, 0.98 * _NODE_BOUND)
    return nodes.to(dtype=dtype, device=device)


@register_guide("amortized-ar2pp", "AR2P trained with the predictive objective (AVDGP AR2PP; "
                "needs an AmortizedGPLayer model)", rule="AR2PP")
@register_guide("amortized-ar2p", "amortized, learned quadrature nodes and weights (AVDGP "
                "AR2P; needs an AmortizedGPLayer model)", rule="AR2P")
@register_guide("amortized-ar2", "amortized, U shared by the paths at their mean input (AVDGP "
                "AR2; needs an AmortizedGPLayer model)", rule="AR2")
@register_guide("amortized-ar1", "amortized encoder per layer, per-point inducing points, own "
                "U per path (AVDGP AR1; needs an AmortizedGPLayer model)", rule="AR1")
class Amortized(LayerGuide):
    """The amortized guide (module docstring) of a model of ``AmortizedGPLayer``\\ s.

    :param model: a :class:`~pyro_dgp.DeepGP` or hand-written model of amortized layers.
    :param encoder: ``None`` (an :class:`~pyro_dgp.guides.encoders.MLPEncoder` per layer), a
        module used for every layer, or a dict of modules by layer name (the others get the
        default); the call contract is in :mod:`pyro_dgp.guides.encoders`.
    :param rule: ``"AR1"``, ``"AR2"``, ``"AR2P"`` (default) or ``"AR2PP"``.
    :param num_paths: S, the paths per point of ``AmortizedELBO`` and the quadrature nodes.
    :param beta: the weight of the KL in the predictive objective of ``AR2PP``.
    :param inner_scale: the initial scale of ``q(u_n)`` of the layers but the last (default
        1, the prior's, as the last layer's and as Meng and Zhang 2024 start the covariances,
        App. C.1). A small one costs about ``-log(inner_scale) - 1/2`` nats per inducing
        output and point: at DSVI's ``sqrt(1e-5)``, about 680 nats per point in
        ``avdgp_regression``'s first layer, which collapses the inner layers to the
        prior (the runs: ``benchmarks/results/history.md``, "The amortized guide's starting
        scale"; records in ``benchmarks/results/amortized.jsonl``).
    """

    mean_field = True
    supports_local_inducing = True
    #: trained by ``AmortizedELBO`` (its rule's objective over the weighted paths)
    default_objective = "amortized"

    def __init__(self, model, encoder=None, rule: str = "AR2P", num_paths: int = 32,
                 beta: float = 1.0, inner_scale: float = 1.0, name=None):
        super().__init__(model, name=name)
        if rule not in RULES:
            raise ValueError(f"Amortized: rule must be one of {RULES}, got {rule!r}")
        self.rule = rule
        self.num_paths = check_positive_int(num_paths, "Amortized: num_paths")
        self.beta = check_positive_finite(beta, "Amortized: beta")
        self.inner_scale = check_positive_finite(inner_scale, "Amortized: inner_scale")
        if encoder is not None and not isinstance(encoder, dict | torch.nn.Module):
            raise TypeError("Amortized: encoder must be None, a torch.nn.Module or a dict of "
                            f"them by layer name, got {type(encoder).__name__}")
        self._given_encoder = encoder
        self._weighted = False
        #: layers whose encoder output has had its values checked (on its first call)
        self._checked: set[str] = set()
        self.encoders = PyroModule()
        self.nodes = PyroModule()

    @property
    def quadrature(self) -> bool:
        """Whether the rule draws its paths at quadrature nodes (``AR2P``, ``AR2PP``)."""
        return self.rule in ("AR2P", "AR2PP")

    @property
    def predictive(self) -> bool:
        """Whether the rule trains with the predictive objective (``AR2PP``)."""
        return self.rule == "AR2PP"

    # ------------------------------------------------------------------- parameters
    def _setup_sites(self, sites: list[LayerSite]) -> None:
        plain = [s.name for s in sites if not getattr(s.layer, "local_inducing", False)]
        if plain:
            raise ValueError(f"Amortized: the layers {plain} have global inducing outputs; "
                             "the amortized guide needs AmortizedGPLayer layers")
        given = self._given_encoder
        self._checked = set()
        if isinstance(given, dict):
            unknown = set(given) - {s.name.rsplit(".", 1)[0] for s in sites}
            if unknown:
                raise ValueError(f"Amortized: encoders given for unknown layers "
                                 f"{sorted(unknown)}")
        for site in sites:
            layer, key = site.layer, site.name.rsplit(".", 1)[0]
            b = layer.inducing_points.detach()
            enc = given.get(key) if isinstance(given, dict) else given
            if enc is None:
                scale = 1.0 if site.is_last else self.inner_scale
                enc = MLPEncoder(layer.input_dim, layer.output_dim, layer.num_inducing, scale,
                                 dtype=b.dtype, device=b.device)
            deep_setattr(self.encoders, key, as_pyro_module(enc, f"layer '{key}'"))
            if self.quadrature:
                nodes = _initial_nodes(self.num_paths, layer.output_dim, b.dtype, b.device)
                deep_setattr(self.nodes, key, PyroParam(_node_logits(nodes)))
        if self.quadrature:
            b = sites[0].layer.inducing_points.detach()
            self.weight_logits = PyroParam(b.new_zeros(self.num_paths))

    def quadrature_nodes(self, layer: str) -> torch.Tensor:
        """``xi (S, D_out)`` of ``layer``, in ``(-5, 5)``."""
        if not self.quadrature:
            raise ValueError(f"Amortized: rule {self.rule} has no quadrature nodes")
        raw = deep_getattr(self.nodes, self.site(layer).name.rsplit(".", 1)[0])
        return _NODE_BOUND * (2 * torch.sigmoid(raw) - 1)

    def path_weights(self) -> torch.Tensor | None:
        """``omega (S,)`` of the quadrature rules, ``None`` (uniform) for the others."""
        if not self.quadrature:
            return None
        self._ensure_set_up()
        return torch.softmax(self.weight_logits, -1)

    def set_quadrature(self, nodes: torch.Tensor, weights: torch.Tensor,
                       layer: str | None = None) -> None:
        """Set the nodes (``(S,)`` for every output, or ``(S, D_out)``; inside ``(-5, 5)``)
        of ``layer`` (``None``: every layer) and the weights ``(S,)`` (positive; normalised)."""
        if not self.quadrature:
            raise ValueError(f"Amortized: rule {self.rule} has no quadrature nodes")
        self._ensure_set_up()
        S = self.num_paths
        nodes, weights = torch.as_tensor(nodes), torch.as_tensor(weights)
        if weights.shape != (S,) or not bool(((weights > 0) & weights.isfinite()).all()):
            raise ValueError(f"Amortized: weights must be {S} positive finite numbers, got "
                             f"shape {tuple(weights.shape)}")
        if nodes.dim() not in (1, 2) or nodes.shape[0] != S or not bool(
                (nodes.abs() < _NODE_BOUND).all()):
            raise ValueError(f"Amortized: nodes must be (S,) or (S, D_out) with S = {S} and "
                             f"|xi| < {_NODE_BOUND}, got shape {tuple(nodes.shape)}")
        new = nodes if nodes.dim() == 2 else nodes.unsqueeze(-1)
        keys = [self.site(key).name.rsplit(".", 1)[0]
                for key in (self.layer_names if layer is None else [layer])]
        # every layer is checked before any is written, so a refused call changes nothing
        for key in keys:
            shape = deep_getattr(self.nodes, key).shape
            if new.shape[-1] not in (1, shape[-1]):
                raise ValueError(f"Amortized: nodes of layer '{key}' must be (S,) or "
                                 f"(S, {shape[-1]}), got shape {tuple(nodes.shape)}")
        for key in keys:
            raw = deep_getattr(self.nodes, key).detach()
            copy_into(self.nodes, key, _node_logits(new.to(raw)).expand(raw.shape))
        logits = self.weight_logits.detach()
        copy_into(self, "weight_logits", (weights / weights.sum()).log().to(logits))

    @contextlib.contextmanager
    def weighted_paths(self) -> Iterator[torch.Tensor | None]:
        """Within this context a run whose path plate (dim -2) has ``num_paths`` entries, such
        as ``predict``'s draws, takes the quadrature nodes in order, as under
        ``AmortizedELBO``. Yields ``omega (S,)`` (detached), the weight of path ``s`` in the
        predictive mixture; ``None`` for the rules without nodes (their draws are i.i.d.)."""
        if not self.quadrature:
            yield None
            return
        with swapped(self, "_weighted", True):
            yield self.path_weights().detach()

    def layer_gaussian(self, site):
        raise NotImplementedError("Amortized: q(u) is per data point (amortized), not one "
                                  "Gaussian per layer")

    # ------------------------------------------------------------------- runs
    def new_run(self, *args, **kwargs) -> AmortizedRun:
        name, size = _path_plate()
        exact = size == self.num_paths and (name == PATH_PLATE or self._weighted)
        return AmortizedRun(paths=size, exact=exact)

    def _weights(self, run: AmortizedRun, P: int, like: torch.Tensor) -> torch.Tensor:
        """``(P,)`` weights of the run's paths: ``omega`` on the exact nodes, else uniform."""
        if run.exact and self.quadrature:
            return self.path_weights().to(like)
        return like.new_full((P,), 1.0 / P)

    def _summary(self, x: torch.Tensor, run: AmortizedRun) -> torch.Tensor:
        """``P(F)``: ``x`` (AR1, or the data), else the weighted mean over the paths (dim -3)
        of the conditional means ``x`` was drawn with (of ``x`` itself where unrecorded)."""
        if self.rule == "AR1":
            return x
        source = source_of(x)
        means = source.loc if source is not None else x
        P = run.paths
        if P is None or means.dim() < 3 or means.shape[-3] != P:
            return means
        w = self._weights(run, P, means)
        return (w.view(P, 1, 1) * means).sum(-3)

    def _node_draws(self, site: LayerSite, run: AmortizedRun) -> torch.Tensor:
        """The nodes of the run's paths: ``(P, 1, D_out)``, or ``(D_out,)`` without paths."""
        xi = self.quadrature_nodes(site.name)
        if run.index is None:
            if run.exact:
                run.index = torch.arange(self.num_paths, device=xi.device)
            else:
                run.index = _systematic(self.path_weights().detach(), run.paths or 1)
        picked = xi[run.index]
        return picked.unsqueeze(-2) if run.paths is not None else picked[0]

    def u_site(self, site, run):
        layer = site.layer
        key = site.name.rsplit(".", 1)[0]
        x = layer.current_input
        at = self._summary(x, run)
        out = deep_getattr(self.encoders, key)(at)
        # the values of the scale (a host sync) on the encoder's first call, and on every
        # call under Pyro's validation (fit: its first step); its shapes always
        validate = key not in self._checked or is_validation_enabled()
        loc, scale = check_encoded(out, at, layer.output_dim, layer.num_inducing, key,
                                   validate, keep_diagonal=True)
        self._checked.add(key)
        run.q[key] = (loc, scale, at)
        return LocalGaussian(loc, scale, layer.inducing_inputs_at(at))

    def f_marginal(self, site, x, u, run):
        loc_u, scale, at = run.q[site.name.rsplit(".", 1)[0]]
        loc, var = site.layer.local_conditional(x, loc_u, scale, at=at)
        if not self.quadrature:
            return loc, var
        nodes = self._node_draws(site, run)
        shape = torch.broadcast_shapes(loc.shape, nodes.shape)
        return QuadratureMarginal(loc.expand(shape), var.expand(shape), nodes)

    def sample_paths(self):
        raise NotImplementedError("Amortized: each point has its own inducing outputs, so the "
                                  "f values of a run are not one function's sample path")

