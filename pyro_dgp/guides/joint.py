"""Guides that couple the inducing outputs of all layers (seed 003 §4.1, REFERENCE.md §3.2-3.3).

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
  gradient at once. Measured on seed 003's toy after 1000 steps (``Coupled``, 200 gradients):
  the summed variance of the gradient is 5.7 to 6.6 times lower than with one shared draw
  (two measurements, 200 gradients each, before and after the final preconditioner). Cost:
  ``O(N T K)`` per step for the draws (``T`` below, ``K`` the factor's columns: ``T`` full
  rank, ``r`` low rank), against ``O(T K)`` for one shared draw; the default
  ``per_point=None`` uses it while ``N T K <= per_point_budget`` (``1e9``: boston, ``N T K =
  9e8``: a whole step took 0.19 s with ``Coupled``, 0.27 s with ``Chain``, one thread on a busy
  machine, BENCHMARKS.md session 4; a 10,000-point minibatch with ``T = 900`` would
  need 8e9). The ``<layer>.f`` values of a
  per-point trace are not one function's values: take sample paths under
  :meth:`~pyro_dgp.guides.base.LayerGuide.shared_draws`.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam

from ..conditional import _solve
from ..layer import _drop_data_dim
from ..linalg import CholeskyError
from ..validation import check_positive_finite, check_positive_int
from .base import LayerGuide, LayerSite, initial_scale_tril, log_density_of_noise
from .meanfield import deep_getattr

__all__ = ["Chain", "Coupled", "JointGaussian", "gaussian_kl_to_layer_prior"]


def gaussian_kl_to_layer_prior(layers, mean, R, d=None, logdet_S=None) -> torch.Tensor:
    """``KL(N(mean, R R^T + diag d) || prod_l prod_d p(u^l_d))`` in closed form.

    :param layers: the :class:`~pyro_dgp.GPLayer`\\ s in the order of ``mean``'s blocks.
    :param mean: ``(T,)``; :param R: ``(T, K)``; :param d: ``(T,)`` or ``None``.
    :param logdet_S: ``log det Cov q`` if known (e.g. from a triangular ``R``).

    With block prior covariances ``P_b`` (``I`` whitened, ``K_ZZ`` unwhitened; one block per
    layer and output) and prior means ``mu_b`` (``m(Z)`` where ``u`` holds function values,
    else 0): ``KL = 1/2 [sum_b tr(P_b^-1 S_bb) + (m_b - mu_b)^T P_b^-1 (m_b - mu_b)
    + log det P_b - T - log det S]``; only the diagonal blocks ``S_bb`` of ``S`` are needed.
    """
    T = mean.shape[-1]
    total = -T - (logdet_S if logdet_S is not None else _logdet(R, d))
    offset = 0
    for layer in layers:
        D, M = layer.output_dim, layer.num_inducing
        n = D * M
        m = mean[offset : offset + n].reshape(D, M)
        if layer.function_values:  # u holds f(Z): the prior mean is m(Z), not 0
            m = m - layer.mean_function(layer.current_inducing_inputs()).mT
        Rb = R[offset : offset + n].reshape(D, M, R.shape[-1])
        db = None if d is None else d[offset : offset + n].reshape(D, M)
        if layer.whiten:
            total = total + (Rb * Rb).sum() + (m * m).sum()
            if db is not None:
                total = total + db.sum()
        else:
            Lk = layer.kzz_cholesky()
            LiR = torch.linalg.solve_triangular(Lk, Rb, upper=False)
            Lim = torch.linalg.solve_triangular(Lk, m.unsqueeze(-1), upper=False)
            total = total + (LiR * LiR).sum() + (Lim * Lim).sum()
            total = total + 2 * D * Lk.diagonal().log().sum()
            if db is not None:
                Kinv_diag = torch.cholesky_inverse(Lk).diagonal()
                total = total + (db * Kinv_diag).sum()
        offset += n
    return 0.5 * total


def _logdet(R, d):
    if d is None:
        raise ValueError("log det S needs d or an explicit value for a non-square factor")
    # matrix determinant lemma: det(D + R R^T) = det(D) det(I + R^T D^-1 R)
    inner = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device) + R.mT @ (R / d.unsqueeze(-1))
    # I + R^T D^-1 R >= I: it fails only on NaN/inf parameters
    L, info = torch.linalg.cholesky_ex(inner)
    if bool(info.any()):
        raise CholeskyError("Coupled (low rank): the covariance factor or diagonal holds "
                            "NaN or inf values")
    return d.log().sum() + L.diagonal().log().sum() * 2


def block_preconditioner(sizes: list[int], like: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` scales of a lower-triangular factor's entries over blocks of the given sizes
    (one block per layer output): 1 within a block (and on the diagonal), ``1/sqrt(n)``
    between blocks.

    Adam moves every coordinate by about ``lr`` per step, so a row of free entries moves by
    about ``lr sqrt(width)``. Within a block that is MeanField's rate, which these scales keep:
    a joint guide's per-layer blocks are parameterised as MeanField's. Across blocks, the
    thousands of cross-output entries of a wide factor moving at that rate inflate the inner
    layers' covariance early in training and stall it. Measured on boston (D = 13; M = 50 in
    session 1, M = 100 here): Chain at 2000 steps, split 0, had test log-likelihood -3.05 with
    the cross entries scaled by ``1/sqrt(b - 1)`` for ``b`` blocks, against -2.15 for
    MeanField. Scaled by ``1/sqrt(n)``, the cross part of a row moves by about ``lr`` whatever
    its width.
    """
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(like.device)
    same = ids[:, None] == ids[None, :]
    cross = torch.full(same.shape, 1.0 / math.sqrt(sum(sizes)), dtype=like.dtype,
                       device=like.device)
    return torch.where(same, torch.ones_like(cross), cross)


def _preconditioned_tril(raw: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``diag(raw) + tril(raw, -1) * scale`` (see :func:`block_preconditioner`)."""
    return raw.tril() * scale


def _raw_tril(L: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_preconditioned_tril`."""
    return L.tril() / scale


def _copy_into(param_holder, name: str, value: torch.Tensor, constraint) -> None:
    """Write the constrained ``value`` into the PyroParam ``name`` of ``param_holder``."""
    *path, leaf = name.split(".")
    module = deep_getattr(param_holder, ".".join(path)) if path else param_holder
    with torch.no_grad():
        getattr(module, leaf + "_unconstrained").copy_(
            torch.distributions.transform_to(constraint).inv(value)
        )


class _JointDraw:
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


class _LayerSlice(dist.TorchDistribution):
    """Layer ``site``'s block of a joint draw, scored as ``log p(u^l) + extra``."""

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, draw: _JointDraw, offset: int, site: LayerSite, extra, batch_shape=()):
        self.draw, self.offset, self.site, self.extra = draw, offset, site, extra
        super().__init__(torch.Size(batch_shape), site.shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return _LayerSlice(self.draw, self.offset, self.site, self.extra, batch_shape)

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("joint guides draw through plates, not sample_shape")
        D, M = self.site.shape
        v = self.draw.get(self.batch_shape)[0][..., self.offset : self.offset + D * M]
        return v.reshape(self.batch_shape + (D, M))

    def log_prob(self, value):
        return self.site.layer.prior().log_prob(value) + self.extra


class JointGaussian(LayerGuide):
    """Abstract base of the cross-layer Gaussian guides (:class:`Coupled`, :class:`Chain`);
    subclasses define the parameters (``_setup_sites``) and ``factor()``. Constructing the
    base itself raises ``TypeError``."""

    mean_field = True  # TraceMeanField_ELBO is exact here: the KL is analytic (module docstring)
    #: ``per_point=None`` draws per point while ``N T K`` is at most this (module docstring)
    per_point_budget = 1e9

    def __init__(self, model, inner_variance: float = 1e-5, per_point: bool | None = None,
                 name=None):
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

    def draws_per_point(self, num_draws: int) -> bool:
        """Whether a run with ``num_draws`` points (times particles) draws ``U`` per point
        (module docstring)."""
        if self._shared_only:
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
                "layer's inducing inputs (inducing='locations'), so the prior of the layer "
                "above depends on them; this guide's closed-form KL assumes a prior of fixed "
                "layer-wise Gaussians. Use MeanField (the guide of seed 003 §4.2) or a "
                "completed autoguide for that model."
            )

    def _preconditioner(self, like: torch.Tensor, site: LayerSite | None = None):
        """:func:`block_preconditioner` of the joint factor (or of ``site``'s block)."""
        sites = self.layer_sites if site is None else [site]
        key = (None if site is None else site.name, like.dtype, like.device)
        cache = self.__dict__.setdefault("_preconditioners", {})
        if key not in cache:
            cache[key] = block_preconditioner([s.shape[-1] for s in sites for _ in
                                               range(s.shape[0])], like)
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
        if not (self._set_up and meanfield._set_up):
            raise ValueError("init_from: run both guides once (guide(X, y)) to create their "
                             "parameters first")
        if meanfield.model is not self.model:
            raise ValueError("init_from: the MeanField guide belongs to another model")
        with torch.no_grad():
            blocks = []
            for site in self.layer_sites:
                loc, tril = meanfield.q_params(meanfield._sites[site.name.rsplit(".", 1)[0]])
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
        """``(v, last_loc, eps)`` as :class:`_JointDraw` keeps them. ``R`` is lower triangular
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

    def log_q(self, v: torch.Tensor) -> torch.Tensor:
        """``(*batch,)`` log-density under ``q`` of joint values ``v (*batch, T)`` (every
        layer's ``vec u^l``, in layer order).

        The guide's own latest shared draw is scored from its noise
        (:func:`~pyro_dgp.guides.base.log_density_of_noise`), without the triangular solve that
        an ill-conditioned factor would spoil; other values by the general formula."""
        mean, R, d, logdet = self.factor()
        latest = self._draw.latest if hasattr(self, "_draw") else None
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
        first site, so that Pyro's ELBOs count exactly ``-KL`` (:class:`_LayerSlice`)."""
        v = torch.cat([guide_trace.nodes[s.name]["value"].reshape(num_draws, -1)
                       for s in self.layer_sites], dim=-1)
        return self.log_q(v)

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

    def kl(self) -> torch.Tensor:
        """``KL(q(U) || p(U))``, closed form."""
        mean, R, d, logdet = self._factor_of_run()
        return gaussian_kl_to_layer_prior([s.layer for s in self.layer_sites], mean, R, d, logdet)

    def _factor_of_run(self):
        """:meth:`factor`, built once per guide run (a ``T x T`` factor and its transforms
        otherwise cost a pass each for the KL, each draw and the collapse)."""
        cached = self.__dict__.get("_run_factor")
        return cached if cached is not None and self._running() else self.factor()

    # the last run's factor, draws and KL (LayerGuide.__getstate__); after a run only log_q
    # reads the latest draw, and a copy scores any value by the general formula
    _per_run = ("_run_factor", "_draw", "_point_draws", "_kl")

    def _before_run(self, *args, **kwargs):
        self.__dict__["_run_factor"] = factor = self.factor()
        self._draw = _JointDraw(self._draw_with_last_loc)
        self._point_draws = _JointDraw(self._draw_with_last_loc)
        self._kl = gaussian_kl_to_layer_prior([s.layer for s in self.layer_sites], *factor)

    def u_site(self, site):
        extra = self._kl if site.index == 0 else 0.0
        return _LayerSlice(self._draw, self._offsets()[site.index], site, extra)

    def f_marginal(self, site, x, u):
        """Inner layers: the model's conditional given ``u^l``; last layer: ``u^L`` collapsed
        through its Gaussian law given the rest of the draw. Per point, each of the ``N``
        points of ``x (..., N, D_in)`` is its own batch entry with its own ``U``."""
        D, M = site.shape
        points = u.shape[:-2] + x.shape[-2:-1]
        per_point = self.draws_per_point(points.numel())
        if per_point:
            v, last_loc, _ = self._point_draws.get(points)
            x = x.unsqueeze(-2)  # (..., N, 1, D_in)
        elif self._draw.latest is None:
            # u was replayed, not drawn in this run (e.g. the global draws on a grid): u is a
            # draw of q, so the model's conditional given it is the sampled-u estimator
            return site.layer.conditional(x, u)
        else:
            v, last_loc, _ = self._draw.latest  # the draw behind u (data plate's singleton)
        if site.is_last:
            loc = last_loc.reshape(last_loc.shape[:-1] + (D, M))
            if not per_point:
                loc = _drop_data_dim(loc)
            out = site.layer.conditional(x, loc, self.last_scale().reshape(D, M, -1))
        elif per_point:
            lo = self._offsets()[site.index]
            out = site.layer.conditional(x, v[..., lo : lo + D * M].unflatten(-1, (D, M)))
        else:
            return site.layer.conditional(x, u)
        return tuple(t.squeeze(-2) for t in out) if per_point else out


class Coupled(JointGaussian):
    """One Gaussian over the inducing outputs of all layers (seed 003 §4.1).

    :param rank: ``None`` for a full ``T x T`` Cholesky factor, or the rank ``r`` of a
        low-rank-plus-diagonal covariance ``W W^T + diag(d)``.
    :param per_point: draw ``U`` per data point (see the module docstring; ``None``: while
        ``N T K <= per_point_budget``).

    Estimator (module docstring): ``u^1..u^{L-1}`` drawn jointly (seed 003's sampled-u
    estimator, unbiased for any q), each ``f^l`` from the model's conditional given ``u^l`` and
    ``f^{l-1}``; ``u^L`` collapsed given the other noise of the draw. Cost O(T^3) (full) or
    O(T r^2) (low rank) per step, T = sum_l D_l M_l.
    """

    def __init__(self, model, rank: int | None = None, inner_variance: float = 1e-5,
                 per_point: bool | None = None, name=None):
        super().__init__(model, inner_variance, per_point, name=name)
        self.rank = None if rank is None else check_positive_int(rank, "Coupled: rank")

    def _setup_sites(self, sites):
        blocks = self._init_blocks()
        ref = blocks[0]
        T = self.dim
        self.loc = PyroParam(torch.cat([s.layer.initial_u_loc().reshape(-1) for s in sites]))
        if self.rank is None:
            # stored raw: factor() applies _preconditioned_tril to it
            self.scale_tril = PyroParam(
                _raw_tril(torch.block_diag(*[b for blk in blocks for b in blk]),
                          self._preconditioner(ref)),
                constraints.lower_cholesky)
        else:
            var = torch.cat([(blk * blk).sum(-1).reshape(-1) for blk in blocks])
            g = torch.Generator(device="cpu").manual_seed(0)
            W = 1e-3 * math.sqrt(T) * torch.randn(T, self.rank, generator=g, dtype=ref.dtype)
            W = W.to(ref.device)  # the factor used is W / sqrt(T): 1e-3 N(0, 1) entries
            self.cov_factor = PyroParam(W)
            self.cov_diag = PyroParam(var, constraints.positive)

    def factor(self):
        if self.rank is None:
            L = _preconditioned_tril(self.scale_tril, self._preconditioner(self.scale_tril))
            return self.loc, L, None, 2 * L.diagonal().log().sum()
        W = self.cov_factor / math.sqrt(self.cov_factor.shape[0])  # a row of W moves ~lr
        return self.loc, W, self.cov_diag, None

    def _set_blocks(self, blocks):
        self.set_joint(torch.cat([loc for loc, _ in blocks]),
                       torch.block_diag(*[tril for _, tril in blocks]))

    def set_joint(self, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Set ``q = N(loc (T,), scale_tril scale_tril^T)`` (full-rank Coupled only)."""
        if self.rank is not None:
            raise ValueError("set_joint needs a full-rank Coupled guide (rank=None)")
        _copy_into(self, "loc", loc, constraints.real)
        _copy_into(self, "scale_tril", _raw_tril(scale_tril, self._preconditioner(scale_tril)),
                   constraints.lower_cholesky)


class Chain(JointGaussian):
    """``q(u^1) prod_{l>1} q(u^l | u^{l-1})`` with Gaussian conditionals (seed 003 eq. 14-17):

        v_1 = m_1 + L_1 e_1,   v_l = m_l + B_l (v_{l-1} - m_{l-1}) + L_l e_l,

    a joint Gaussian with block-tridiagonal precision and parameters linear in depth.

    Estimator (module docstring): ``u^1..u^{L-1}`` are drawn (ancestrally) and
    ``f^1..f^{L-1}`` come from the model's conditionals; the last layer's ``u^L`` is integrated
    out through ``q(u^L | u^{L-1})`` (Gaussian, independent of everything else given
    ``u^{L-1}``), so ``f^L`` is drawn from the collapsed marginal: exact, and of lower variance
    than sampling ``u^L``. ``per_point`` as for :class:`Coupled`.
    """

    def __init__(self, model, inner_variance: float = 1e-5, per_point: bool | None = None,
                 name=None):
        super().__init__(model, inner_variance, per_point, name=name)
        self.locs = PyroModule()
        self.scale_trils = PyroModule()
        self.couplings = PyroModule()

    def _setup_sites(self, sites):
        for site, blk in zip(sites, self._init_blocks(), strict=True):
            n = site.shape.numel()
            deep_setattr(self.locs, site.name, PyroParam(site.layer.initial_u_loc().reshape(n)))
            tril = torch.block_diag(*blk)
            deep_setattr(self.scale_trils, site.name,
                         PyroParam(_raw_tril(tril, self._preconditioner(tril, site)),
                                   constraints.lower_cholesky))
            if site.index > 0:
                prev = sites[site.index - 1].shape.numel()
                deep_setattr(self.couplings, site.name, PyroParam(blk.new_zeros(n, prev)))

    def _scale(self, site: LayerSite) -> torch.Tensor:
        """``L_l (n_l, n_l)``, the Cholesky factor of ``Cov q(u^l | u^{l-1})``."""
        raw = deep_getattr(self.scale_trils, site.name)
        return _preconditioned_tril(raw, self._preconditioner(raw, site))

    def _coupling(self, site: LayerSite) -> torch.Tensor:
        """``C_l = B_l L_{l-1}`` ``(n_l, n_{l-1})``, the stored coupling (see
        :meth:`block_params`)."""
        # C holds cross-layer entries only (see block_preconditioner)
        return deep_getattr(self.couplings, site.name) / self._coupling_divisor(site)

    def block_params(self, site: LayerSite):
        """``(m_l (n_l,), L_l (n_l, n_l), B_l (n_l, n_{l-1}) or None)``.

        The parameter is ``C_l = B_l L_{l-1}``, the coupling to the layer below's whitened
        residual ``w_{l-1} = L_{l-1}^{-1} (v_{l-1} - m_{l-1})``, not ``B_l``: the same family,
        but a gradient step on ``B_l`` changes the cross covariance ``B_l L_{l-1} L_{l-1}^T``
        in proportion to the small inner-layer scale (``L_{l-1} ~ sqrt(inner_variance) I`` at
        the start), so the coupling hardly moved. Measured on seed 003's toy (4000 steps,
        10 trials): Chain kept a fifth of Coupled's ``Var[f1(0)]`` and trailed its ELBO,
        though with two layers the two families are the same. ``C_l`` is in the units of
        Coupled's cross-layer factor entries (with two layers it is that block). Draws and
        :meth:`factor` use ``C_l`` and ``w`` directly (``v_l = m_l + C_l w_{l-1} + L_l e_l``),
        never ``L_{l-1}^{-1}`` applied to a difference of draws, whose gradient for
        ``L_{l-1}`` would be two large terms that cancel.
        """
        L = self._scale(site)
        B = None
        if site.index > 0:  # B = C L_{l-1}^{-1}, i.e. B^T = L_{l-1}^{-T} C^T
            below = self._scale(self.layer_sites[site.index - 1])
            B = torch.linalg.solve_triangular(below.mT, self._coupling(site).mT, upper=True).mT
        return deep_getattr(self.locs, site.name), L, B

    def _set_blocks(self, blocks):
        sizes = [s.shape.numel() for s in self.layer_sites]
        for site, (loc, tril) in zip(self.layer_sites, blocks, strict=True):
            coupling = None if site.index == 0 else loc.new_zeros(loc.shape[-1],
                                                                  sizes[site.index - 1])
            self.set_block(site, loc, tril, coupling)

    def set_block(self, site: LayerSite, loc, scale_tril, coupling=None) -> None:
        """Set ``q(u^l | u^{l-1}) = N(loc + coupling (v_{l-1} - m_{l-1}), scale_tril ...)``.

        :param loc: ``(n_l,)``; :param scale_tril: ``(n_l, n_l)``;
        :param coupling: ``(n_l, n_{l-1})`` (not for the first layer). It is stored relative to
            the layer below's ``scale_tril`` (see :meth:`block_params`): set that layer first.
        """
        _copy_into(self.locs, site.name, loc, constraints.real)
        _copy_into(self.scale_trils, site.name,
                   _raw_tril(scale_tril, self._preconditioner(scale_tril, site)),
                   constraints.lower_cholesky)
        if coupling is not None:
            with torch.no_grad():  # stored as C = B L_{l-1} (see block_params)
                below = self._scale(self.layer_sites[site.index - 1])
            _copy_into(self.couplings, site.name, coupling @ below * self._coupling_divisor(site),
                       constraints.real)

    def _coupling_divisor(self, site: LayerSite) -> float:
        return math.sqrt(self.layer_sites[site.index - 1].shape.numel())

    def factor(self):
        """The joint as ``v = mean + R e`` with block lower-triangular ``R`` (T x T)."""
        means, rows, logdet = [], [], 0.0
        T = self.dim
        offset, W = 0, None  # W (n_{l-1}, T): w_{l-1} = W e
        for site in self.layer_sites:
            m, L = deep_getattr(self.locs, site.name), self._scale(site)
            n = m.shape[-1]
            block = slice(offset, offset + n)
            # out of place throughout: the triangular solve's output is saved for backward
            place = (block.start, T - block.stop)  # pad (n, n) to (n, T) at this block
            coupled = None if W is None else self._coupling(site) @ W  # C_l w_{l-1}
            W_next = None
            if not site.is_last:  # w_l = L_l^{-1} C_l w_{l-1} + e_l
                W_next = F.pad(torch.eye(n, dtype=L.dtype, device=L.device), place)
                if coupled is not None:
                    W_next = W_next + torch.linalg.solve_triangular(L, coupled, upper=False)
            row = F.pad(L, place) if coupled is None else coupled + F.pad(L, place)
            means.append(m)
            rows.append(row)
            logdet = logdet + 2 * L.diagonal().log().sum()
            offset, W = offset + n, W_next
        return torch.cat(means), torch.cat(rows), None, logdet

    def joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean (T,), covariance (T, T))`` of ``q(v)``."""
        mean, R, _, _ = self.factor()
        return mean, R @ R.mT

    def _draw_with_last_loc(self, batch_shape):
        # ancestral sampling: O(sum_l n_l (n_l + n_{l-1})) per draw, not the dense T^2. The
        # noises e_l of the conditionals are the joint draw's eps: q(v) = prod_l N(e_l; 0, I)
        # / prod_l det L_l, which is log_q's formula with log det Cov = 2 sum_l log diag L_l
        parts, noises, w, loc = [], [], None, None
        for site in self.layer_sites:
            m, L = deep_getattr(self.locs, site.name), self._scale(site)
            shift = None if w is None else w @ self._coupling(site).mT  # C_l w_{l-1}
            loc = m if shift is None else m + shift
            eps = torch.randn(batch_shape + m.shape, dtype=m.dtype, device=m.device)
            parts.append(loc + eps @ L.mT)
            noises.append(eps)
            if not site.is_last:  # w_l = L_l^{-1} C_l w_{l-1} + e_l
                # one triangular solve for all draws (the batch folded into its columns)
                w = eps if shift is None else eps + _solve(L, shift.unsqueeze(-1),
                                                           upper=False).squeeze(-1)
        return torch.cat(parts, -1), loc, torch.cat(noises, -1)

    def last_scale(self):
        return self._scale(self.layer_sites[-1])
