"""Likelihoods ``p(y | f)`` for the last layer, with expectations under Gaussian ``f``.

A likelihood is called inside the model's data plate as ``likelihood(f, y)`` and emits the
observation site. Where the guide attached the Gaussian ``N(loc, var)`` that ``f`` was drawn
from (see :mod:`pyro_dgp.likelihoods.marginal`), the site scores ``E_{N(f; loc, var)} log
p(y | f)`` instead of ``log p(y | f)`` (DSVI's analytic last layer, DESIGN.md contract 4):
closed form for the Gaussian, exact 1-D integrals on fixed log-scale trapezoid grids for the
Student-t, Gauss-Hermite otherwise. Where that Gaussian is ``p(f | u, f_prev)`` at a guide's
own draw (guides whose runs are importance weights, ``per_draw_weights``), inside
:func:`~pyro_dgp.likelihoods.marginal.importance_weights` it scores
``log int p(y | f) N(f; loc, var) df = log p(y | draw)`` instead (see :class:`_Expected`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, PyroParam
from torch.special import log_ndtr, ndtr

from ..validation import (
    check_positive_finite,
    check_positive_int,
    check_targets,
    positive_tensor,
    unique_name,
)
from .marginal import importance_weighting, source_of

__all__ = [
    "Likelihood",
    "Gaussian",
    "BernoulliProbit",
    "StudentT",
    "gauss_hermite",
]


@functools.lru_cache(maxsize=32)
def _hermgauss(n: int, dtype: torch.dtype, device: torch.device):
    x, w = np.polynomial.hermite.hermgauss(n)
    nodes = torch.as_tensor(x * math.sqrt(2.0), dtype=dtype, device=device)
    log_w = torch.as_tensor(np.log(w / math.sqrt(math.pi)), dtype=dtype, device=device)
    return nodes, log_w


def gauss_hermite(loc: torch.Tensor, var: torch.Tensor, num_points: int = 20):
    """Nodes and log-weights for expectations under ``N(loc, var)``.

    :returns: ``(f, log_w)``: ``f`` of shape ``(num_points, *loc.shape)`` and ``log_w`` of shape
        ``(num_points, 1, ..., 1)``; ``E[g(f)] ~= sum_k exp(log_w_k) g(f_k)``.
    """
    nodes, log_w = _hermgauss(num_points, loc.dtype, loc.device)
    view = (-1,) + (1,) * loc.dim()
    f = loc + var.clamp_min(0).sqrt() * nodes.view(view)
    return f, log_w.view(view)


#: the Student-t predictive grid covers outliers up to |y - loc| = _T_MAX_OUTLIER * scale
_T_MAX_OUTLIER = 1e6
#: nats below the integrand's peak at which the Student-t predictive grid is cut
_T_DROP = 40.0


def _expm1_minus_x_root(q: float) -> float:
    """The positive root x of e^x - x - 1 = q (Newton from sqrt(2 q), above the root)."""
    x = math.sqrt(2 * q)
    for _ in range(100):
        step = (math.expm1(x) - x - q) / math.expm1(x)
        x -= step
        if step < 1e-12 * x:
            break
    return x


@functools.lru_cache(maxsize=32)
def _t_predictive_grid(df: float, dtype: torch.dtype, device: torch.device):
    """Nodes ``lam_k = e^{tau_k}`` and log-weights ``c_k`` for the Student-t predictive.

    The integrand in tau, g(tau) = Gamma(lam; a, rate a) lam N(y | loc, var + s^2 / lam) with
    a = df / 2, is ``exp(A tau - a lam - log(var lam + s^2) / 2 - r^2 lam / (2 (var lam + s^2)))``
    up to constants, A = a + 1/2, r = y - loc. Range: at var = 0 it is exp(A tau - B e^tau),
    B = a + r^2 / (2 s^2), peaked at tau* = log(A / B) and falling by A (e^x - x - 1) nats at
    tau* + x; var > 0 only moves mass towards tau = 0. So [lo, hi] runs from _T_DROP nats below
    the peak of the largest outlier (r = _T_MAX_OUTLIER s) on the left (x <= -(q + 1) suffices,
    q = _T_DROP / A) to _T_DROP nats below the peak of r = 0 on the right: the truncated mass is
    < e^-40 relative. Spacing: g is analytic in |Im tau| < pi/2 (exp(-a e^tau) grows beyond;
    var lam + s^2 vanishes only at Im tau = pi), so the trapezoid rule's error falls
    geometrically, ~exp(-2 pi d / h) with d -> pi/2; for large df the peak narrows to width
    A^-1/2 and the aliasing error of a near-Gaussian, exp(-2 pi^2 / (A h^2)), takes over.
    h = 0.7 / sqrt(A + 4) keeps both near 1e-12 relative (measured against scipy quad of
    log int N(f; loc, var) t(y | f) df: max 5e-13 over df in [0.5, 100], var in [0, 1e4] s^2,
    |y - loc| <= 1e3 s; 160 to 280 nodes there, ~25 sqrt(df) for large df). The rule is not
    exact at var = 0, where the integral is log t(y | loc), but within that error of it."""
    a = df / 2
    big_a = a + 0.5
    q = _T_DROP / big_a
    lo = math.log(big_a / (a + _T_MAX_OUTLIER**2 / 2)) - (q + 1)
    hi = math.log(big_a / a) + _expm1_minus_x_root(q)
    n = math.ceil((hi - lo) / (0.7 / math.sqrt(big_a + 4))) + 1
    tau = np.linspace(lo, hi, n)
    lam = np.exp(tau)
    h = (hi - lo) / (n - 1)
    const = (math.log(h) + a * math.log(a) - math.lgamma(a) - 0.5 * math.log(2 * math.pi)
             + big_a * tau - a * lam)
    return (torch.as_tensor(lam, dtype=dtype, device=device),
            torch.as_tensor(const, dtype=dtype, device=device))


@functools.lru_cache(maxsize=32)
def _t_expected_grid(dtype: torch.dtype, device: torch.device):
    """Nodes ``t_k = e^{tau_k}``, ``1 / t_k`` and weights ``w_k = h e^{-t_k}`` for the Student-t
    expected log-density, ``E log(1 + z) = sum_k w_k (1 - phi(t_k))`` (see
    :meth:`StudentT.expected_log_prob`; :class:`_FrullaniLog1p` integrates the difference
    from var = 0, which has the same properties).

    The integrand g(tau) = (1 - phi(e^tau)) exp(-e^tau) depends on the data only through
    a = 2 var / c and b = r^2 / c. It is analytic in |Im tau| < pi/2 (exp(-e^tau) grows beyond;
    phi's branch point is at Im tau = pi) and bounded there, so the trapezoid rule's error is
    ~exp(-2 pi d / h), d -> pi/2: with h = 0.4, ~exp(-pi^2 / 0.4) ~ 2e-11 relative.
    Truncation: right of tau = 3.6 the integrand is below exp(-e^3.6) ~ 1e-16; left of
    tau = -50, 1 - phi(t) <= t E[z], so the tail is < e^-50 E[z] ~ 2e-22 E[z] (< 1e-10 for
    |y - loc| <= 1e6 s and var <= 1e8 s^2). 135 nodes.
    Measured against scipy quad of E log t: max 1.3e-9 absolute over df in [0.5, 100] (error
    grows as (df + 1) / 2), var in [0, 1e4] s^2, |y - loc| <= 1e3 s (tests/test_likelihoods.py)."""
    lo, hi, n = -50.0, 3.6, 135
    t = np.exp(np.linspace(lo, hi, n))
    w = (hi - lo) / (n - 1) * np.exp(-t)
    return tuple(torch.as_tensor(x, dtype=dtype, device=device) for x in (t, 1 / t, w))


class _FrullaniLog1p(torch.autograd.Function):
    """``E log(1 + z) = log1p(b) + sum_k w_k (e^{-b t_k} - phi(t_k))`` with
    ``phi(t) = (1 + a t)^{-1/2} exp(-b t / (1 + a t))`` (a = 2 var / c, b = (y - loc)^2 / c, see
    :meth:`StudentT.expected_log_prob`), and its gradient in (a, b) in the same pass.

    ``e^{-b t}`` is phi at var = 0, whose integral ``int (1 - e^{-bt}) e^{-t} / t dt`` is
    ``log1p(b)`` exactly: a control variate, so that only the effect of var is left to the
    quadrature and var = 0 gives log t(y | loc) to rounding. Gradient: ``dE/db = 1 / (1 + b) +
    sum_k w_k (phi_k t_k / u_k - t_k e^{-b t_k})``, ``dE/da = sum_k w_k phi_k (t_k / (2 u_k) -
    b t_k^2 / u_k^2)``, u = 1 + a t. It runs on every training step, so it is written for speed:
    ``t / u = 1 / (a + 1/t)``, ``1 / u = (t / u) / t``, no log1p or expm1 on (..., nodes) (slow on
    CPU), exponents clamped at -80 (e^-80 is below any weight's resolution; exp does not
    underflow, which is slow), and no (..., nodes) tensor kept for the backward pass. The sums
    carry an absolute error ~``eps sum_k w_k`` (~50 eps; 1e-14 in float64, the dtype it is called
    in). First derivatives only."""

    @staticmethod
    def forward(ctx, a, b, t, inv_t, w):
        neg_b = -b.unsqueeze(-1)
        t_over_u = (a.unsqueeze(-1) + inv_t).reciprocal_()
        neg_q = t_over_u * neg_b
        phi = torch.exp(neg_q.clamp_min_(-80)).mul_((t_over_u * inv_t).sqrt_())
        e0 = torch.exp((neg_b * t).clamp_min_(-80))
        value = torch.log1p(b) + (e0 @ w - phi @ w)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            g = phi.mul_(t_over_u)
            g_w = g @ w
            grad_b = (1 + b).reciprocal() + (g_w - e0.mul_(t) @ w)
            grad_a = 0.5 * g_w + g.mul_(neg_q) @ w
            ctx.save_for_backward(grad_a, grad_b)
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        grad_a, grad_b = ctx.saved_tensors
        return grad * grad_a, grad * grad_b, None, None, None


class _Expected(dist.TorchDistribution):
    """Observation site of a last layer whose ``f`` carries its Gaussian ``N(f; loc, var)``.

    ``log_prob(y)`` is ``E_{N(f; loc, var)} log p(y | f)`` (DSVI's analytic last layer), or,
    with ``integrated=True``, ``log int p(y | f) N(f; loc, var) df``: where ``N(loc, var)`` is
    the model's own ``p(f | u, f_prev)`` at a guide's draw, that is ``log p(y | draw)``, so a
    run's log-densities sum to the draw's importance weight (Rao-Blackwellised over the last
    layer), as ``RenyiELBO``, IWAE and ``pyro.infer.Importance`` need (see
    :mod:`pyro_dgp.importance`; the expectation is lower, by a draw-dependent amount).

    ``sample()`` draws ``y ~ p(y | f)`` at the trace's own ``f`` (so ``y`` and the recorded
    ``f`` are one joint draw).

    Its density is evaluated when the loss is summed, after the model's call, where the
    likelihood's ``PyroSample`` hyperparameters would be fresh prior draws and its
    ``PyroParam`` reads no ``pyro.param`` statements. So it holds the values read during the
    call (``hyperparameters``) and evaluates under them."""

    arg_constraints = {}
    support = constraints.real

    def __init__(self, likelihood: Likelihood, loc: torch.Tensor, var: torch.Tensor,
                 hyperparameters: dict | None = None, f: torch.Tensor | None = None,
                 integrated: bool = False):
        self.likelihood, self.loc, self.var, self.f = likelihood, loc, var, f
        self.integrated = integrated
        self.hyperparameters = (likelihood.hyperparameters() if hyperparameters is None
                                else hyperparameters)
        batch_shape = loc.shape
        super().__init__(batch_shape, torch.Size(), validate_args=False)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        f = None if self.f is None else self.f.expand(batch_shape)
        return _Expected(self.likelihood, self.loc.expand(batch_shape),
                         self.var.expand(batch_shape), self.hyperparameters, f, self.integrated)

    def log_prob(self, value):
        if self.integrated:
            return self.predictive_log_prob(value)
        with self.likelihood.fixed(self.hyperparameters):
            return self.likelihood.expected_log_prob(value, self.loc, self.var)

    def predictive_log_prob(self, value):
        """``log int p(y | f) N(f; loc, var) df`` under the hyperparameters of the call."""
        with self.likelihood.fixed(self.hyperparameters):
            return self.likelihood.predictive_log_prob(value, self.loc, self.var)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad(), self.likelihood.fixed(self.hyperparameters):
            if self.f is None:
                f = dist.Normal(self.loc, self.var.sqrt()).sample(sample_shape)
            else:
                f = self.f.expand(torch.Size(sample_shape) + self.f.shape)
            return self.likelihood.conditional(f).sample()


class Likelihood(PyroModule):
    """Base class. ``f`` passed in has shape ``(..., N, 1)``; ``y`` has shape ``(N,)``.

    A likelihood built on its own gets a unique Pyro name (two never share parameters in
    Pyro's param store); assigned to a model it is renamed ``<model>.likelihood``.
    """

    #: whether y must be 0/1
    binary = False

    def __init__(self, num_gh_points: int = 20):
        super().__init__(name=unique_name(type(self).__name__))
        #: Gauss-Hermite nodes of the default expectations (:meth:`expected_log_prob`,
        #: :meth:`predictive_log_prob`); 20, as GPflow's and GPyTorch's likelihoods
        self.num_gh_points = check_positive_int(
            num_gh_points, f"{type(self).__name__}: num_gh_points")

    def conditional(self, f: torch.Tensor) -> dist.Distribution:
        """``p(y | f)`` for ``f`` of shape ``(..., N)``."""
        raise NotImplementedError

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """``{name: value}`` of this module's ``PyroParam`` and ``PyroSample`` attributes, as
        read now (inside a model's call: ``pyro.param`` statements and the guide's draws)."""
        names = {**self.__dict__.get("_pyro_params", {}), **self.__dict__.get("_pyro_samples", {})}
        return {name: getattr(self, name) for name in names}

    @contextlib.contextmanager
    def fixed(self, values: dict[str, torch.Tensor]) -> Iterator[Likelihood]:
        """Within the block, reads of the named hyperparameters return ``values``.

        Instance attributes shadow ``PyroModule.__getattr__``, which serves ``PyroParam`` and
        ``PyroSample`` attributes only when ordinary lookup fails."""
        shadowed = [name for name in values if name not in self.__dict__]
        self.__dict__.update({name: values[name] for name in shadowed})
        try:
            yield self
        finally:
            for name in shadowed:
                del self.__dict__[name]

    def expected_log_prob(self, y, loc, var):
        """``E_{N(f; loc, var)} log p(y | f)``, Gauss-Hermite; shapes ``(..., N)``."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        return (log_w.exp() * self.conditional(f).log_prob(y)).sum(0)

    def predictive_log_prob(self, y, loc, var):
        """``log int p(y | f) N(f; loc, var) df``, Gauss-Hermite; shapes ``(..., N)``."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        return torch.logsumexp(log_w + self.conditional(f).log_prob(y), dim=0)

    def forward(self, f: torch.Tensor, y: torch.Tensor | None = None, name: str = "y"):
        """Emit the observation site ``name`` inside the caller's data plate.

        :param f: ``(..., N, 1)`` last-layer function values.
        :param y: ``(N,)`` observations or ``None``.
        """
        if f.shape[-1] != 1:
            raise ValueError(
                f"{type(self).__name__} is for a single output; the last layer has "
                f"{f.shape[-1]} outputs"
            )
        if y is not None:
            if is_validation_enabled():  # a pass over y and a host sync: not in fit's hot loop
                check_targets(y, f.shape[-2], label=name, binary=self.binary)
            if y.dim() != 1:
                raise ValueError(f"{name} must be 1-D of shape (N,), got {tuple(y.shape)}")
        source = source_of(f)
        if source is not None:
            loc, var = source.loc.squeeze(-1), source.var.squeeze(-1)
            # reads the hyperparameters now, in this call
            integrated = source.given_draw and importance_weighting()
            fn = _Expected(self, loc, var, f=f.squeeze(-1), integrated=integrated)
        else:
            fn = self.conditional(f.squeeze(-1))
        return pyro.sample(name, fn, obs=y)


class Gaussian(Likelihood):
    """``y ~ N(f, variance)``; ``variance`` is a positive ``PyroParam`` (init 0.01): a number
    (torch's default dtype) or a one-element floating-point tensor (its own dtype and
    device)."""

    def __init__(self, variance: float = 0.01):
        super().__init__()
        variance = positive_tensor(variance, "Gaussian: variance", scalar=True)
        self.variance = PyroParam(variance, constraints.positive)

    def conditional(self, f):
        return dist.Normal(f, self.variance.sqrt())

    def expected_log_prob(self, y, loc, var):
        # E log N(y | f, s2) under N(f; loc, var), written out (no Normal to construct)
        noise = self.variance
        return -0.5 * (math.log(2 * math.pi) + noise.log() + ((y - loc).square() + var) / noise)

    def predictive_log_prob(self, y, loc, var):
        return dist.Normal(loc, (var + self.variance).sqrt()).log_prob(y)

    def predictive_moments(self, loc, var):
        """Mean and variance of ``y`` under ``N(f; loc, var)``."""
        return loc, var + self.variance


class BernoulliProbit(Likelihood):
    """``p(y = 1 | f) = Phi(f)`` for labels in {0, 1}.

    The predictive ``log p(y)`` is closed-form; the ELBO's ``E log Phi(+-f)`` is
    ``num_gh_points``-point Gauss-Hermite, exact to rounding for latent variances up to about
    1. Its error grows with the variance: ``log Phi`` bends over a width of about 1 around 0,
    which nodes spaced in proportion to the latent standard deviation resolve less well
    (``tests/test_likelihoods.py`` measures it at variances 10 and 100). Raise
    ``num_gh_points`` where the last layer's variance is large.
    """

    binary = True

    def conditional(self, f):
        return _Probit(f)

    def predictive_log_prob(self, y, loc, var):
        z = loc / (1 + var).sqrt()
        return torch.where(y > 0.5, log_ndtr(z), log_ndtr(-z))

    def predictive_moments(self, loc, var):
        p = ndtr(loc / (1 + var).sqrt())
        return p, p * (1 - p)


class _Probit(dist.TorchDistribution):
    """Bernoulli with ``p = Phi(f)``, scored with ``log_ndtr`` (stable in the tails)."""

    arg_constraints = {}
    support = constraints.boolean

    def __init__(self, f):
        self.f = f
        super().__init__(f.shape, torch.Size(), validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return _Probit(self.f.expand(batch_shape))

    def log_prob(self, value):
        return torch.where(value > 0.5, log_ndtr(self.f), log_ndtr(-self.f))

    def sample(self, sample_shape=torch.Size()):
        return torch.bernoulli(ndtr(self.f).expand(sample_shape + self.f.shape))


class StudentT(Likelihood):
    """``y ~ StudentT(df, f, scale)``; ``scale`` learned (init 0.1), ``df`` fixed.

    Both expectations under ``N(f; loc, var)`` are exact 1-D integrals evaluated by the
    trapezoid rule in a log variable (see :func:`_t_predictive_grid`, :func:`_t_expected_grid`),
    accurate for every ``var >= 0`` (at ``var = 0`` they are ``log t(y | loc)``): Gauss-Hermite
    in ``f`` cannot resolve the t density, a spike of width ``scale`` at ``f = y``, when
    ``sd(f) >> scale``."""

    def __init__(self, df: float = 4.0, scale: float = 0.1):
        super().__init__()
        self.df = check_positive_finite(df, "StudentT: df")
        scale = positive_tensor(scale, "StudentT: scale", scalar=True)
        self.scale = PyroParam(scale, constraints.positive)

    def conditional(self, f):
        return dist.StudentT(self.df, f, self.scale)

    def _log_normaliser(self, scale):
        df = self.df
        return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2)
                - 0.5 * math.log(df * math.pi) - scale.log())

    def expected_log_prob(self, y, loc, var):
        # log t(y | f) = C - (df + 1)/2 log(1 + z), z = (y - f)^2 / c, c = df s^2, and
        # log(1 + z) = int_0^inf (1 - e^{-z t}) e^{-t} / t dt (Frullani). For f ~ N(loc, var),
        # E e^{-z t} = phi(t) = (1 + 2 t var / c)^{-1/2} exp(-t (y - loc)^2 / (c + 2 t var)), so
        # E log(1 + z) = int (1 - phi(e^tau)) exp(-e^tau) dtau over tau = log t: one smooth
        # integral per point, on a fixed trapezoid grid (see _t_expected_grid, _FrullaniLog1p).
        scale = self.scale.to(loc)
        c = self.df * scale.square()
        a, b = torch.broadcast_tensors(2 * var.clamp_min(0) / c, (y - loc).square() / c)
        # in float64 whatever loc's dtype (MPS has none): _FrullaniLog1p's value carries an
        # absolute error ~50 eps, times (df + 1) / 2: in float32 ~1e-4 or more at large df,
        # against ~1e-6 relative from float32 inputs, as here
        work = loc.dtype if loc.device.type == "mps" else torch.float64
        e_log1p = _FrullaniLog1p.apply(a.to(work), b.to(work),
                                       *_t_expected_grid(work, loc.device))
        return self._log_normaliser(scale) - (self.df + 1) / 2 * e_log1p.to(loc.dtype)

    def predictive_log_prob(self, y, loc, var):
        # Gamma scale mixture t(y | f, s) = E_lam N(y | f, s^2 / lam), lam ~ Gamma(df/2, rate
        # df/2), so p(y) = E_lam N(y | loc, var + s^2 / lam), integrated over tau = log lam by
        # the trapezoid rule on a fixed grid (_t_predictive_grid), in log space:
        #   log p = log sum_k exp(c_k - log(var lam_k + s^2) / 2
        #                          - (y - loc)^2 lam_k / (2 (var lam_k + s^2)))
        # with c_k = log h + log Gamma-density in tau + (tau_k - log 2 pi) / 2.
        s2 = self.scale.to(loc).square().unsqueeze(-1)
        lam, const = _t_predictive_grid(self.df, loc.dtype, loc.device)
        d = var.clamp_min(0).unsqueeze(-1) * lam + s2
        r2 = (y - loc).square().unsqueeze(-1)
        return torch.logsumexp(const - 0.5 * d.log() - 0.5 * r2 * lam / d, dim=-1)

    def predictive_moments(self, loc, var):
        if self.df <= 2:
            return loc, torch.full_like(var, math.inf)
        return loc, var + self.scale**2 * self.df / (self.df - 2)
