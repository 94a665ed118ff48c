"""Guides that couple the inducing outputs of all layers (Ustyuzhaninov et al. 2020, §4.1).

Both guides are Gaussian over ``v = [vec(u^1); ...; vec(u^L)]`` (``vec`` row-major over
``(D_l, M_l)``, in each layer's own whitened or unwhitened parameterisation), written as
``v = mean + R eps (+ sqrt(d) eps')``, so they share one closed-form KL to the layer-wise prior
and one way of handing samples to the layer sites.

The KL is exact and analytic: each ``<layer>.u`` site of the guide scores ``log p(u^l)`` (the
model's own prior at the drawn value) and the first also adds ``KL(q || p)``. In any ELBO the
guide's and model's ``log p(u^l)`` cancel exactly (values and gradients), leaving
``E log p(y | f) - KL``: Trace_ELBO and TraceMeanField_ELBO both compute the same
unbiased estimate, with no Monte Carlo noise from the KL.

Estimator of ``E_q log p(y | f^L)``, shared by both guides:

- the last layer's ``u^L`` is integrated out given the noise of the layers above (its law
  given them is Gaussian, so ``f^L`` has a Gaussian marginal): exact, lower variance;
- ``per_point=True`` draws ``U`` independently for each data point (a local
  reparameterisation, as DSVI's collapsed ``f`` draws are per point). The expected
  log-likelihood is a sum over points of expectations under the same ``q(U)``, so each term may
  use its own draw: unbiased, and the noise of one shared ``U`` no longer hits every point's
  gradient at once, which lowers the gradient's variance (measured on the compositional toy of
  Ustyuzhaninov et al. 2020: ``benchmarks/results/history.md``, "Per-point draws: the
  gradient's variance and the step time (joint guides)"). Cost:
  ``O(N T K)`` per step for the draws (``T`` below, ``K`` the factor's columns: ``T`` full
  rank, ``r`` low rank), against ``O(T K)`` for one shared draw; the default
  ``per_point=None`` uses it while ``N T K <= per_point_budget`` (``1e9``: boston, ``N T K =
  9e8``, whose step times are in ``BENCHMARKS.md``, "How do the guides compare?"; a
  10,000-point minibatch with ``T = 900`` would need 8e9). The ``<layer>.f`` values of a
  per-point trace are not one function's values: take sample paths under
  :meth:`~pyro_dgp.guides.base.LayerGuide.shared_draws`.
- ``estimator="collapsed"`` (with per-point draws) integrates every layer's ``u`` out per
  point, not only the last one's: each ``f^l`` is drawn from its exact law given the point's
  earlier values (:mod:`pyro_dgp.guides.joint_collapse`). The same ELBO, of no higher
  variance: per point it is the sampled estimate's expectation given the point's inner draws
  of ``f`` (``tests/guides/test_joint_collapse.py``). The default ``"sampled"`` draws the
  inner layers' ``u`` as above; at equal steps the collapsed estimator did not train Coupled
  further (``benchmarks/results/history.md``, "Why Coupled trails MeanField: the cross-layer
  entries").
"""

from __future__ import annotations

from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from ..gp.distributions import drop_data_dim
from ..gp.kl import gaussian_kl_to_layer_prior
from ..validation import check_positive_finite
from . import estimators
from .base import GuideRun, LayerGuide
from .gaussian import LayerGaussian, initial_scale_tril, log_density_of_noise
from .joint_collapse import PointPosterior, collapsed_joint
from .params import block_preconditioner
from .prototype import LayerSite

__all__ = ["JointGaussian", "LayerSlice"]


def _noise_rows(R: torch.Tensor, d: torch.Tensor | None) -> torch.Tensor:
    """``[R, diag(sqrt d)]`` (``R`` where ``d`` is ``None``): rows ``(n, K)`` whose product
    with their transpose is ``R R^T + diag d``."""
    return R if d is None else torch.cat([R, torch.diag(d.sqrt())], -1)


class JointDraw:
    """Joint draws for one guide run, keyed by batch shape (the plates' shape for the
    ``<layer>.u`` sites, plus the points for per-point draws): ``(v (*batch, T), last_loc
    (*batch, n_L), eps (*batch, T) or None)``, ``last_loc`` the mean of ``u^L`` given all other
    noise of the draw, ``eps`` the standard normal noise of a full-rank draw
    ``v = mean + R eps``."""

    def __init__(self, sample_fn):
        self.sample_fn, self.cache, self.latest = sample_fn, {}, None

    def get(self, batch_shape: torch.Size) -> tuple:
        if batch_shape not in self.cache:
            self.cache[batch_shape] = self.sample_fn(batch_shape)
        self.latest = self.cache[batch_shape]
        return self.latest


class LayerSlice(dist.TorchDistribution):
    """Layer ``site``'s block of a joint draw, scored as ``log p(u^l) + extra``."""

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, draw: JointDraw, offset: int, site: LayerSite, extra, batch_shape=()):
        self.draw, self.offset, self.site, self.extra = draw, offset, site, extra
        super().__init__(torch.Size(batch_shape), site.shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return LayerSlice(self.draw, self.offset, self.site, self.extra, batch_shape)

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("joint guides draw through plates, not sample_shape")
        D, M = self.site.shape
        v = self.draw.get(self.batch_shape)[0][..., self.offset : self.offset + D * M]
        return v.reshape(self.batch_shape + (D, M))

    def log_prob(self, value):
        return self.site.layer.prior().log_prob(value) + self.extra


@dataclass
class JointRun(GuideRun):
    """One run of a :class:`JointGaussian`: its factor ``(mean, R, d, log det)``, the joint
    draws shared by its ``.u`` sites and those per point, and the closed-form KL."""

    factor: tuple = ()
    draw: JointDraw | None = None
    point_draws: JointDraw | None = None
    kl: torch.Tensor | float = 0.0
    collapse: PointPosterior | None = None


class JointGaussian(LayerGuide):
    """Abstract base of the cross-layer Gaussian guides (:class:`Coupled`, :class:`Chain`);
    subclasses define the parameters (``_setup_sites``) and ``factor()``. Constructing the
    base itself raises ``TypeError``."""

    mean_field = True  # TraceMeanField_ELBO is exact here: the KL is analytic (module docstring)
    #: ``per_point=None`` draws per point while ``N T K`` is at most this (module docstring)
    per_point_budget = 1e9

    def __init__(self, model, inner_variance: float = 0.01, per_point: bool | None = None,
                 estimator: str = "sampled", name=None):
        if type(self).factor is JointGaussian.factor:
            raise TypeError(
                f"{type(self).__name__} is an abstract base of the cross-layer guides (it has "
                "no parameters of its own): use pyro_dgp.guides.Coupled (one Gaussian over all "
                "layers, full or low rank) or pyro_dgp.guides.Chain (layer-to-layer Gaussian "
                "conditionals), or subclass it defining factor() and _setup_sites()"
            )
        super().__init__(model, name=name)
        self.inner_variance = check_positive_finite(inner_variance,
                                                    f"{type(self).__name__}: inner_variance")
        self.per_point = None if per_point is None else bool(per_point)
        if estimator not in ("sampled", "collapsed"):
            raise ValueError(f"{type(self).__name__}: estimator must be 'sampled' or "
                             f"'collapsed', got {estimator!r}")
        self.estimator = estimator

    def draws_per_point(self, num_draws: int) -> bool:
        """Whether a run with ``num_draws`` points (times particles) draws ``U`` per point
        (module docstring)."""
        if self.draws_shared:
            return False
        if self.per_point is not None:
            return self.per_point
        K = self._factor_of_run()[1].shape[-1]
        return num_draws * self.dim * K <= self.per_point_budget

    def setup(self, *args, **kwargs) -> None:
        super().setup(*args, **kwargs)
        bad = [s.name for s in self.layer_sites if s.layer.function_values]
        if bad:
            raise ValueError(
                f"{type(self).__name__}: layers {bad} hold function values that are the next "
                "layer's inducing inputs (inducing_scheme='propagated'), so the prior of the layer "
                "above depends on them; this guide's closed-form KL assumes a prior of fixed "
                "layer-wise Gaussians. Use MeanField (the guide of Ustyuzhaninov et al. 2020, "
                "§4.2) or a completed autoguide for that model."
            )

    def _preconditioner(self, like: torch.Tensor, site: LayerSite | None = None,
                        strict: bool = False):
        """:func:`block_preconditioner` of the joint factor (or of ``site``'s block); with
        ``strict``, its strictly lower part (what
        :func:`~pyro_dgp.guides.params.preconditioned_cholesky` takes)."""
        sites = self.layer_sites if site is None else [site]
        key = (None if site is None else site.name, like.dtype, like.device, strict)
        cache = self.__dict__.setdefault("_preconditioners", {})
        if key not in cache:
            scale = block_preconditioner([s.shape[-1] for s in sites for _ in
                                          range(s.shape[0])], like)
            cache[key] = scale.tril(-1) if strict else scale
        return cache[key]

    def _offsets(self) -> list[int]:
        out, total = [], 0
        for site in self.layer_sites:
            out.append(total)
            total += site.shape.numel()
        return out

    @property
    def dim(self) -> int:
        """T = sum_l D_l M_l."""
        return sum(s.shape.numel() for s in self.layer_sites)

    def _init_blocks(self):
        """Per layer ``(D, M, M)`` Cholesky factors of the initial covariance (MeanField's)."""
        return [initial_scale_tril(site, self.inner_variance).expand(*site.shape, site.shape[-1])
                for site in self.layer_sites]

    def init_from(self, meanfield) -> None:
        """Start at a (fitted) :class:`MeanField` guide's ``q`` of the same model: the same
        per-layer Gaussians and no cross-layer terms, so the ELBO starts where mean-field's
        is and training can only add dependence between layers."""
        if not (self.is_set_up and meanfield.is_set_up):
            raise ValueError("init_from: run both guides once (guide(X, y)) to create their "
                             "parameters first")
        if meanfield.model is not self.model:
            raise ValueError("init_from: the MeanField guide belongs to another model")
        with torch.no_grad():
            blocks = []
            for site in self.layer_sites:
                loc, tril = meanfield.q_params(meanfield.site(site.name))
                blocks.append((loc.reshape(-1), torch.block_diag(*tril)))
            self._set_blocks(blocks)

    def _set_blocks(self, blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Set ``q`` to independent layers ``N(loc_l (n_l,), tril_l tril_l^T)``."""
        raise NotImplementedError

    def factor(self):
        """``(mean (T,), R (T, K), d (T,) or None, log det Cov q)``."""
        raise NotImplementedError(f"{type(self).__name__}.factor: defined by the subclasses "
                                  "(Coupled, Chain)")

    def sample(self, batch_shape: torch.Size) -> torch.Tensor:
        """``(*batch_shape, T)`` reparameterised draws of ``v``."""
        return self._draw_with_last_loc(batch_shape)[0]

    def _draw_with_last_loc(self, batch_shape: torch.Size):
        """``(v, last_loc, eps)`` as :class:`JointDraw` keeps them. ``R`` is lower triangular
        (full rank), so the last block's own noise is ``eps[T - n_L:]``; with
        ``W W^T + diag d`` it is the diagonal part's (and ``eps`` is ``None``)."""
        mean, R, d, _ = self._factor_of_run()
        lo = self._offsets()[-1]
        eps = torch.randn(batch_shape + (R.shape[-1],), dtype=mean.dtype, device=mean.device)
        if d is None:
            head = mean + eps[..., :lo] @ R[:, :lo].mT
            return head + eps[..., lo:] @ R[:, lo:].mT, head[..., lo:], eps
        head = mean + eps @ R.mT
        noise = d.sqrt() * torch.randn(batch_shape + mean.shape, dtype=mean.dtype,
                                       device=mean.device)
        return head + noise, head[..., lo:], None

    def log_q(self, v: torch.Tensor, draw: JointDraw | None = None) -> torch.Tensor:
        """``(*batch,)`` log-density under ``q`` of joint values ``v (*batch, T)`` (every
        layer's ``vec u^l``, in layer order).

        Where ``v`` is the latest shared draw of ``draw`` (a run's :class:`JointDraw`) it is
        scored from its noise (:func:`~pyro_dgp.guides.gaussian.log_density_of_noise`),
        without the triangular solve that an ill-conditioned factor would spoil; other values
        by the general formula."""
        mean, R, d, logdet = self.factor()
        latest = None if draw is None else draw.latest
        own = (d is None and latest is not None and latest[0].numel() == v.numel()
               and torch.equal(latest[0].reshape(v.shape), v))
        if own:
            return log_density_of_noise(latest[2].reshape(v.shape), logdet)
        if d is None:
            return dist.MultivariateNormal(mean, scale_tril=R).log_prob(v)
        return dist.LowRankMultivariateNormal(mean, R, d).log_prob(v)

    def layers_log_q(self, guide_trace, num_draws: int) -> torch.Tensor:
        """``(S,)`` joint ``log q(u^1, ..., u^L)`` of the ``S = num_draws`` shared draws in
        ``guide_trace`` (one draw of every layer per sample). The ``<layer>.u`` sites' own
        ``log_prob`` is not ``log q``: it is ``log p(u^l)`` plus the closed-form KL on the
        first site, so that Pyro's ELBOs count exactly ``-KL`` (:class:`LayerSlice`)."""
        v = torch.cat([guide_trace.nodes[s.name]["value"].reshape(num_draws, -1)
                       for s in self.layer_sites], dim=-1)
        # the run's joint draw, held by the sites' distributions
        draw = getattr(guide_trace.nodes[self.layer_sites[0].name]["fn"], "draw", None)
        return self.log_q(v, draw)

    def last_scale(self) -> torch.Tensor:
        """``(n_L, K)``: a factor of ``Cov(vec u^L | all other noise)`` (see
        :meth:`_draw_with_last_loc`)."""
        _, R, d, _ = self._factor_of_run()
        lo = self._offsets()[-1]
        return R[lo:, lo:] if d is None else torch.diag(d[lo:].sqrt())

    def marginal(self, site: LayerSite) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean (n,), covariance (n, n))`` of layer ``site``'s block ``q(vec u^l)``."""
        mean, Rb, d, _ = self.marginal_factor(site)
        cov = Rb @ Rb.mT
        if d is not None:
            cov = cov + torch.diag(d)
        return mean, cov

    def marginal_factor(self, site: LayerSite):
        """``(mean (n,), R_b (n, K), d_b (n,) or None, log det Cov or None)``: layer
        ``site``'s block ``q(vec u^l) = N(mean, R_b R_b^T + diag d_b)``, as
        :func:`gaussian_kl_to_layer_prior` takes it.

        Full rank: the block's rows of the joint factor, with ``log det`` from a QR
        decomposition of them. Refactorising ``R_b R_b^T`` by Cholesky fails once Adam has
        made the factor ill-conditioned (``cond ~ 1e17`` after a few dozen steps)."""
        mean, R, d, _ = self.factor()
        lo = self._offsets()[site.index]
        hi = lo + site.shape.numel()
        if d is not None:
            return mean[lo:hi], R[lo:hi], d[lo:hi], None
        Rb = R[lo:hi, :hi]  # R is lower triangular: the columns beyond hi are zero
        r = torch.linalg.qr(Rb.mT, mode="r")[1]  # Rb Rb^T = r^T r
        return mean[lo:hi], Rb, None, 2 * r.diagonal().abs().log().sum()

    def layer_gaussian(self, site: LayerSite) -> LayerGaussian:
        mean, Rb, d, _ = self.marginal_factor(site)
        return LayerGaussian(mean, rows=_noise_rows(Rb, d))

    def layer_kl(self, site: LayerSite | str, random_inducing: bool = False) -> torch.Tensor:
        site = self.site(site) if isinstance(site, str) else site
        with torch.no_grad():
            return gaussian_kl_to_layer_prior([site.layer], *self.marginal_factor(site))

    def _joint_q(self):
        with torch.no_grad():
            mean, R, d, _ = self.factor()
            if d is None:
                return dist.MultivariateNormal(mean.clone(), scale_tril=R.clone())
            return dist.LowRankMultivariateNormal(mean.clone(), R.clone(), d.clone())

    def _set_layer(self, site, loc, scale_tril):
        """``q(vec u^l)`` set to ``N(loc, scale_tril scale_tril^T)``, independent of the other
        layers, whose joint is kept."""
        joint = self._joint_q()
        mean, cov = joint.loc.clone(), joint.covariance_matrix.clone()
        lo = self._offsets()[site.index]
        block = slice(lo, lo + site.shape.numel())
        mean[block] = loc
        cov[block, :] = 0
        cov[:, block] = 0
        cov[block, block] = scale_tril @ scale_tril.mT
        self._set_joint(mean, torch.linalg.cholesky(cov))

    def kl(self) -> torch.Tensor:
        """``KL(q(U) || p(U))``, closed form."""
        mean, R, d, logdet = self._factor_of_run()
        return gaussian_kl_to_layer_prior([s.layer for s in self.layer_sites], mean, R, d, logdet)

    def _factor_of_run(self):
        """:meth:`factor`, built once per guide run (a ``T x T`` factor and its transforms
        otherwise cost a pass each for the KL, each draw and the collapse)."""
        run = self.current_run()
        return run.factor if run is not None else self.factor()

    def new_run(self, *args, **kwargs) -> JointRun:
        factor = self.factor()
        return JointRun(factor=factor,
                        draw=JointDraw(self._draw_with_last_loc),
                        point_draws=JointDraw(self._draw_with_last_loc),
                        collapse=PointPosterior(),
                        kl=gaussian_kl_to_layer_prior([s.layer for s in self.layer_sites],
                                                      *factor))

    def u_site(self, site, run):
        extra = run.kl if site.index == 0 else 0.0
        return LayerSlice(run.draw, self._offsets()[site.index], site, extra)

    def f_marginal(self, site, x, u, run):
        """Inner layers: the model's conditional given ``u^l``; last layer: ``u^L`` collapsed
        through its Gaussian law given the rest of the draw. Per point, each of the ``N``
        points of ``x (..., N, D_in)`` is its own batch entry with its own ``U``."""
        D, M = site.shape
        points = u.shape[:-2] + x.shape[-2:-1]
        per_point = self.draws_per_point(points.numel())
        if per_point and self.estimator == "collapsed":
            return self._collapsed(site, x, run)
        if per_point:
            v, last_loc, _ = run.point_draws.get(points)
        elif run.draw.latest is None:
            # u was replayed, not drawn in this run (e.g. the global draws on a grid): u is a
            # draw of q, so the model's conditional given it is the sampled-u estimator
            return estimators.sampled(site, x, u)
        else:
            v, last_loc, _ = run.draw.latest  # the draw behind u (data plate's singleton)
        if site.is_last:
            loc = last_loc.reshape(last_loc.shape[:-1] + (D, M))
            scale = self.last_scale().reshape(D, M, -1)
            if per_point:
                return estimators.per_point(site, x, loc, scale)
            return estimators.collapsed(site, x, drop_data_dim(loc), scale)
        if per_point:
            lo = self._offsets()[site.index]
            return estimators.per_point(site, x, v[..., lo : lo + D * M].unflatten(-1, (D, M)))
        return estimators.sampled(site, x, u)

    def _collapsed(self, site, x, run):
        """:func:`~pyro_dgp.guides.joint_collapse.collapsed_joint` with layer ``site``'s rows
        of the run's factor (low rank: ``[W, diag(sqrt d)]``, the noise ``(e, e')``)."""
        mean, R, d, _ = self._factor_of_run()
        R = _noise_rows(R, d)
        D, M = site.shape
        lo = self._offsets()[site.index]
        return collapsed_joint(site, x, mean[lo : lo + D * M].reshape(D, M),
                               R[lo : lo + D * M].reshape(D, M, -1), run.collapse)
