"""Likelihoods ``p(y | f)`` for the last layer, with expectations under Gaussian ``f``.

A likelihood is called inside the model's data plate as ``likelihood(f, y)`` and emits the
observation site. Where the guide attached the Gaussian ``N(loc, var)`` that ``f`` was drawn
from (see :mod:`pyro_dgp.likelihoods.marginal`), the site scores ``E_{N(f; loc, var)} log
p(y | f)`` instead of ``log p(y | f)`` (the analytic last layer of Salimbeni and Deisenroth 2017):
closed form for the Gaussian, exact 1-D integrals on fixed log-scale trapezoid grids for the
Student-t, Gauss-Hermite otherwise. Where that Gaussian is ``p(f | u, f_prev)`` at a guide's
own draw (guides whose runs are importance weights, ``per_draw_weights``), inside
:func:`~pyro_dgp.likelihoods.marginal.importance_weights` it scores
``log int p(y | f) N(f; loc, var) df = log p(y | draw)`` instead (see :class:`AnalyticObservation`).

The protocol (``docs/likelihoods.md``): a subclass must define :meth:`Likelihood.conditional`,
the distribution ``p(y | f)``; everything else has a default built on it: Gauss-Hermite for
the expectations and the predictive moments, and draws ``f ~ N(loc, var)``, ``y ~ p(y | f)``
(:meth:`Likelihood.predictive_sample`) for what has no closed form.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule

from ..validation import check_positive_int, check_targets, unique_name
from .marginal import importance_weighting, source_of

__all__ = ["AnalyticObservation", "Likelihood", "gauss_hermite", "standard_normal_rule"]


@functools.lru_cache(maxsize=32)
def standard_normal_rule(n: int, dtype: torch.dtype, device: torch.device):
    """The ``n``-point Gauss-Hermite rule for ``E_{N(0, 1)}``: nodes ``(n,)`` and log-weights
    ``(n,)``, ``E g(z) ~= sum_k exp(log_w_k) g(z_k)`` (numpy's rule for ``exp(-x^2)``, rescaled)."""
    x, w = np.polynomial.hermite.hermgauss(n)
    nodes = torch.as_tensor(x * math.sqrt(2.0), dtype=dtype, device=device)
    log_w = torch.as_tensor(np.log(w / math.sqrt(math.pi)), dtype=dtype, device=device)
    return nodes, log_w


def gauss_hermite(loc: torch.Tensor, var: torch.Tensor, num_points: int = 20):
    """Nodes and log-weights for expectations under ``N(loc, var)``.

    :returns: ``(f, log_w)``: ``f`` of shape ``(num_points, *loc.shape)`` and ``log_w`` of shape
        ``(num_points, 1, ..., 1)``; ``E[g(f)] ~= sum_k exp(log_w_k) g(f_k)``.
    """
    nodes, log_w = standard_normal_rule(num_points, loc.dtype, loc.device)
    view = (-1,) + (1,) * loc.dim()
    f = loc + var.clamp_min(0).sqrt() * nodes.view(view)
    return f, log_w.view(view)


class AnalyticObservation(dist.TorchDistribution):
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
        if batch_shape == self.batch_shape:
            return self  # Pyro's plates expand every site's distribution to its own shape
        f = None if self.f is None else self.f.expand(batch_shape)
        return AnalyticObservation(self.likelihood, self.loc.expand(batch_shape),
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

    def alpha_log_prob(self, value, alpha: float):
        """``log E_{N(f; loc, var)} [p(y | f)^alpha]`` under the hyperparameters of the call."""
        with self.likelihood.fixed(self.hyperparameters):
            return self.likelihood.alpha_log_expectation(value, self.loc, self.var, alpha)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad(), self.likelihood.fixed(self.hyperparameters):
            if self.f is None:
                f = dist.Normal(self.loc, self.var.sqrt()).sample(sample_shape)
            else:
                f = self.f.expand(torch.Size(sample_shape) + self.f.shape)
            return self.likelihood.distribution(f).sample()


class _Fixed:
    """:meth:`Likelihood.fixed`'s context (a class: scored once per step, where a generator
    context costs several calls more)."""

    def __init__(self, likelihood: Likelihood, values: dict[str, torch.Tensor]):
        self.likelihood, self.values, self.shadowed = likelihood, values, []

    def __enter__(self) -> Likelihood:
        attrs = self.likelihood.__dict__
        self.shadowed = [name for name in self.values if name not in attrs]
        attrs.update({name: self.values[name] for name in self.shadowed})
        return self.likelihood

    def __exit__(self, *exc) -> None:
        attrs = self.likelihood.__dict__
        for name in self.shadowed:
            del attrs[name]


class Likelihood(PyroModule):
    """Base class. ``f`` passed in has shape ``(..., N, 1)``; ``y`` has shape ``(N,)``.

    A likelihood built on its own gets a unique Pyro name (two never share parameters in
    Pyro's param store); assigned to a model it is renamed ``<model>.likelihood``.
    """

    #: whether y must be 0/1: the predictive of a mixture is then Bernoulli(mean), with
    #: closed-form CRPS (the Brier score), CDF and quantiles
    binary = False
    #: whether ``int p(y | f) N(f; loc, var) df`` is the normal with
    #: :meth:`predictive_moments`: the mixture's CRPS, CDF and quantiles are then closed form
    gaussian_predictive = False

    def __init__(self, num_gh_points: int = 20):
        super().__init__(name=unique_name(type(self).__name__))
        #: Gauss-Hermite nodes of the default expectations (:meth:`expected_log_prob`,
        #: :meth:`predictive_log_prob`); 20, as GPflow's and GPyTorch's likelihoods
        self.num_gh_points = check_positive_int(
            num_gh_points, f"{type(self).__name__}: num_gh_points")

    def conditional(self, f: torch.Tensor) -> dist.Distribution:
        """``p(y | f)`` for ``f`` of shape ``(..., N)``: a distribution of batch shape
        ``f.shape`` (broadcast with the hyperparameters) and event shape ``()``. The one
        member a subclass must define."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define conditional(f): a Likelihood subclass must "
            "return the distribution p(y | f) for f of shape (..., N) (docs/likelihoods.md)")

    def distribution(self, f: torch.Tensor) -> dist.Distribution:
        """:meth:`conditional` at ``f``, checked to be a torch distribution."""
        p = self.conditional(f)
        if not isinstance(p, torch.distributions.Distribution):
            raise TypeError(f"{type(self).__name__}.conditional(f) must return a torch "
                            f"Distribution p(y | f), got {type(p).__name__}")
        return p

    def hyperparameters(self) -> dict[str, torch.Tensor]:
        """``{name: value}`` of this module's ``PyroParam`` and ``PyroSample`` attributes, as
        read now (inside a model's call: ``pyro.param`` statements and the guide's draws)."""
        names = {**self.__dict__.get("_pyro_params", {}), **self.__dict__.get("_pyro_samples", {})}
        return {name: getattr(self, name) for name in names}

    def fixed(self, values: dict[str, torch.Tensor]) -> _Fixed:
        """A context within which reads of the named hyperparameters return ``values``; it
        enters as this likelihood.

        Instance attributes shadow ``PyroModule.__getattr__``, which serves ``PyroParam`` and
        ``PyroSample`` attributes only when ordinary lookup fails."""
        return _Fixed(self, values)

    def expected_log_prob(self, y, loc, var):
        """``E_{N(f; loc, var)} log p(y | f)``, Gauss-Hermite; shapes ``(..., N)``."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        return (log_w.exp() * self.distribution(f).log_prob(y)).sum(0)

    def predictive_log_prob(self, y, loc, var):
        """``log int p(y | f) N(f; loc, var) df``, Gauss-Hermite; shapes ``(..., N)``."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        return torch.logsumexp(log_w + self.distribution(f).log_prob(y), dim=0)

    def alpha_log_expectation(self, y, loc, var, alpha: float):
        """``log E_{N(f; loc, var)} [p(y | f)^alpha]``, Gauss-Hermite; shapes ``(..., N)`` (the
        local alpha-divergence objective, :mod:`pyro_dgp.infer.alpha`)."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        return torch.logsumexp(log_w + alpha * self.distribution(f).log_prob(y), dim=0)

    def predictive_moments(self, loc, var):
        """Mean and variance of ``y`` under ``int p(y | f) N(f; loc, var) df``; shapes
        ``(..., N)``.

        By the laws of total expectation and variance, ``E y = E_f m(f)`` and ``Var y =
        E_f [v(f) + (m(f) - E y)^2]`` with ``m``, ``v`` the mean and variance of
        :meth:`conditional`, each by Gauss-Hermite (exact where ``v`` and ``m^2`` are polynomials
        in ``f`` of degree at most ``2 num_gh_points - 1``, as for a Gaussian). Raises
        ``NotImplementedError`` where ``p(y | f)`` has no ``mean`` or ``variance``; the
        predictive mixture then estimates them from :meth:`predictive_sample`."""
        f, log_w = gauss_hermite(loc, var, self.num_gh_points)
        p = self.distribution(f)
        try:
            m, v = p.mean, p.variance
        except NotImplementedError as err:
            raise NotImplementedError(
                f"{type(self).__name__}: conditional(f) ({type(p).__name__}) has no mean or "
                "variance; define predictive_moments(loc, var)") from err
        w = log_w.exp()
        mean = (w * m).sum(0)
        return mean, (w * (v + (m - mean).square())).sum(0)

    def predictive_sample(self, loc, var, num_samples: int) -> torch.Tensor:
        """``(num_samples, *loc.shape)`` draws of ``y`` from ``int p(y | f) N(f; loc, var)
        df``: ``f = loc + sqrt(var) eps``, ``eps ~ N(0, 1)``, then ``y ~ p(y | f)``, from
        torch's global random state (seed it with :func:`pyro_dgp.rng.seeded`). In ``loc``'s
        dtype and on its device."""
        eps = torch.randn((num_samples, *loc.shape), dtype=loc.dtype, device=loc.device)
        f = loc + var.clamp_min(0).sqrt() * eps  # var >= 0 up to rounding, as gauss_hermite
        y = self.distribution(f).sample()
        if y.shape != f.shape:
            raise ValueError(
                f"{type(self).__name__}.conditional(f) must draw one y per f (batch shape "
                f"f.shape, event shape ()); f has shape {tuple(f.shape)}, the draw "
                f"{tuple(y.shape)}")
        return y.to(loc.dtype)

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
            fn = AnalyticObservation(self, loc, var, f=f.squeeze(-1), integrated=integrated)
        else:
            fn = self.distribution(f.squeeze(-1))
        return pyro.sample(name, fn, obs=y)
