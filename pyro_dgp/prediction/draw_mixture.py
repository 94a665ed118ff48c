"""The predictive of a model whose observation site has no likelihood with closed forms: the
mixture over ``S`` guide draws of the site's own distribution ``p(y | draw_s)``.

A hand-written model that samples ``pyro.sample("y", dist.Poisson(f.exp()), obs=y)`` gives,
traced under ``S`` draws of its guide, a distribution of batch shape ``(S, n)``: component
``s`` at point ``i`` is ``p(y_i | f_s(x_i))`` at that draw's function values. Their mixture
``sum_s w_s p(y | draw_s)`` is the Monte Carlo estimate of the posterior predictive
``int p(y | f) q(f) df``, exact as a mixture of the ``S`` components (the analytic mixture of
:class:`~pyro_dgp.prediction.MixturePredictive` also integrates each draw's last layer out).

Closed forms where the components have them: the log-density (``logsumexp`` of the
components'), the mean and variance (law of total variance over the components' ``mean`` and
``variance``), and the CRPS, CDF and quantiles of normal components (Grimit et al. 2006) and
of Bernoulli ones (the Brier score); otherwise estimates from ``K`` draws of ``y`` per
component and point (:mod:`.sampled`), seeded as :class:`~pyro_dgp.prediction.MixturePredictive`
seeds them. Categorical components (a softmax classifier) give class probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributions import Bernoulli, Categorical, Distribution, Normal

from ..rng import seeded
from ..validation import binary_labels, check_positive_int
from .mixture import (
    ComponentMoments,
    bernoulli_cdf,
    bernoulli_quantiles,
    check_units,
    check_weights,
    gaussian_mixture_cdf,
    gaussian_mixture_crps,
    gaussian_mixture_quantiles,
    mixture_average,
)
from .sampled import sample_cdf, sample_crps, sample_quantiles

__all__ = ["DrawMixturePredictive"]


def _dtype_device(component: Distribution) -> tuple[torch.dtype, torch.device]:
    """The floating-point dtype and the device of a distribution's parameters (a
    ``Categorical``'s logits, a ``Poisson``'s rate...)."""
    for name in component.arg_constraints:
        value = getattr(component, name, None)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype, value.device
    raise ValueError(f"DrawMixturePredictive: the components ({type(component).__name__}) "
                     "have no floating-point parameter to take the dtype and device from")


class DrawMixturePredictive(ComponentMoments):
    """``p(y* | x*) = sum_s w_s p(y* | draw_s)`` per test point, ``w_s = 1/S`` or given weights.

    :param components: a distribution of batch shape ``(S, N)`` and event shape ``()`` (the
        observation site's under ``S`` guide draws), or a sequence of them, ``(S, n_c)`` each,
        whose points are concatenated (``predict`` gives one per batch of test points).
    :param y_mean, y_std: affine map from model units to reporting units (``y = y_mean +
        y_std * y_model``); densities are divided by ``y_std``.
    :param mc_samples: draws per point for the estimates without closed form (default 1000).
    :param mc_seed: seed of those draws; ``None`` draws from the global random state.
    :param weights: the components' weights, ``(S,)``, ``(S, 1)`` or ``(S, N)``, summing to
        one over ``S``; ``None``: uniform.
    """

    def __init__(self, components: Distribution | Sequence[Distribution], y_mean=0.0,
                 y_std=1.0, mc_samples: int = 1000, mc_seed: int | None = 0, weights=None):
        parts = [components] if isinstance(components, Distribution) else list(components)
        if not parts:
            raise ValueError("DrawMixturePredictive: components must hold a distribution")
        for part in parts:
            _check_component(part, parts[0])
        self.components = parts
        self.dtype, self.device = _dtype_device(parts[0])
        self.y_mean, self.y_std = check_units(y_mean, y_std, "DrawMixturePredictive")
        self.mc_samples = check_positive_int(mc_samples, "DrawMixturePredictive: mc_samples")
        self.mc_seed = (None if mc_seed is None else check_positive_int(
            mc_seed, "DrawMixturePredictive: mc_seed", allow_zero=True))
        like = torch.empty(0, dtype=self.dtype, device=self.device)
        #: ``(S, 1)`` or ``(S, N)`` weights of the components, or ``None`` (uniform)
        self.weights = check_weights(weights, self.num_samples, self.num_points, like)

    # ------------------------------------------------------------------------------ structure
    @property
    def num_samples(self) -> int:
        """``S``: the guide draws, one component each."""
        return self.components[0].batch_shape[0]

    @property
    def num_points(self) -> int:
        """``N``: the test points."""
        return sum(part.batch_shape[1] for part in self.components)

    @property
    def draws_per_component(self) -> int:
        """``K``: draws of ``y`` per component and point for the sampled estimates."""
        return max(2, math.ceil(self.mc_samples / self.num_samples))

    @property
    def binary(self) -> bool:
        """Whether the components are Bernoulli (``y`` holds 0/1 labels)."""
        return isinstance(self.components[0], Bernoulli)

    @property
    def categorical(self) -> bool:
        """Whether the components are categorical (labels ``0 ... C-1``)."""
        return isinstance(self.components[0], Categorical)

    @property
    def gaussian(self) -> bool:
        """Whether the components are normal: the CRPS, CDF and quantiles are closed forms."""
        return isinstance(self.components[0], Normal)

    def rescale(self, y_mean: float, y_std: float) -> DrawMixturePredictive:
        """The same predictive reported in units ``y = y_mean + y_std * y_model``."""
        return DrawMixturePredictive(self.components, y_mean, y_std, self.mc_samples,
                                     self.mc_seed, self.weights)

    def _points(self):
        """``(component, slice of its points, its weights)`` for each part."""
        lo = 0
        for part in self.components:
            n = part.batch_shape[1]
            w = self.weights
            if w is not None and w.shape[-1] > 1:
                w = w[:, lo : lo + n]
            yield part, slice(lo, lo + n), w
            lo += n

    # ---------------------------------------------------------------------------- targets
    def check_targets(self, y) -> torch.Tensor:
        """``y`` as a tensor of shape ``(N,)`` in the predictive's dtype: for Bernoulli
        components labels 0/1 or -1/1 (read as 0/1), for categorical ones whole numbers in
        ``[0, C)``; else a ``ValueError`` naming the values."""
        y = torch.as_tensor(y, device=self.device).to(self.dtype)
        if y.shape != (self.num_points,):
            hint = "; use y.squeeze(-1)" if y.shape == (self.num_points, 1) else ""
            raise ValueError(f"y must have the predictive's shape ({self.num_points},), got "
                             f"{tuple(y.shape)}{hint}")
        z = (y - self.y_mean) / self.y_std
        if self.binary:
            return binary_labels(z).to(y.dtype) * self.y_std + self.y_mean
        if self.categorical:
            C = self.num_classes
            if not bool(((z == z.round()) & (z >= 0) & (z < C)).all()):
                raise ValueError(f"y: class labels must be whole numbers in [0, {C}), got the "
                                 f"values {sorted(set(z.unique().tolist()))[:10]}")
        return y

    # ------------------------------------------------------------------------ the mixture
    def _component_log_probs(self, z: torch.Tensor) -> torch.Tensor:
        """``(S, N)`` ``log p(z_i | draw_s)`` in model units."""
        with torch.no_grad():
            return torch.cat([part.log_prob(z[points]) for part, points, _ in self._points()],
                             -1)

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` mixture log-density ``logsumexp_s (log p_s(y) + log w_s)``."""
        z = (self.check_targets(y) - self.y_mean) / self.y_std
        lp = self._component_log_probs(z)
        if self.weights is None:
            lp = torch.logsumexp(lp, 0) - math.log(self.num_samples)
        else:
            lp = torch.logsumexp(lp + self.weights.log(), 0)
        return lp - math.log(self.y_std)

    @property
    def num_classes(self) -> int:
        """``C`` of categorical components."""
        if not self.categorical:
            raise ValueError("num_classes needs categorical components")
        return self.components[0].logits.shape[-1]

    def class_probabilities(self) -> torch.Tensor:
        """``(N, C)`` mixture class probabilities ``sum_s w_s p(y = c | draw_s)`` of Bernoulli
        (``C = 2``) or categorical components.

        :raises ValueError: the components are neither."""
        if not (self.binary or self.categorical):
            raise ValueError(f"class_probabilities needs Bernoulli or Categorical "
                             f"observations, these are {type(self.components[0]).__name__}")
        with torch.no_grad():
            if self.binary:
                p = torch.cat([part.probs.expand(part.batch_shape) for part in self.components],
                              -1)
                p = mixture_average(p, self.weights)
                return torch.stack([1 - p, p], -1)
            probs = torch.cat([part.probs.expand(*part.batch_shape, -1)
                               for part in self.components], -2)  # (S, N, C)
            return mixture_average(probs.movedim(-1, 0), self.weights).movedim(0, -1)

    def _model_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(S, N)`` mean and variance of each component in model units; raises
        ``NotImplementedError`` where the distribution has none."""
        if self.categorical:
            raise ValueError("a categorical predictive has no mean or variance: score it with "
                             "class_probabilities() and metrics.classification_report")
        with torch.no_grad():
            means = [part.mean.expand(part.batch_shape) for part in self.components]
            variances = [part.variance.expand(part.batch_shape) for part in self.components]
        return torch.cat(means, -1), torch.cat(variances, -1)

    def _component_moments(self):
        mean, var = self._model_moments()
        return self.y_mean + self.y_std * mean, self.y_std**2 * var

    def _over_draws(self, fn) -> torch.Tensor:
        """``fn(draws, points, weights)`` over the parts, concatenated along the last dim:
        ``draws`` ``(K, S, n)`` of ``y`` in model units from the components at ``points``,
        from ``mc_seed``."""
        K = self.draws_per_component
        out = []
        with torch.no_grad(), seeded(self.mc_seed, self.device):
            for part, points, w in self._points():
                out.append(fn(part.sample((K,)).to(self.dtype), points, w))
        return torch.cat(out, -1)

    def _bernoulli_p(self) -> torch.Tensor:
        return self.class_probabilities()[:, 1]

    def crps(self, y: torch.Tensor) -> torch.Tensor:
        """``(N,)`` CRPS at ``y``: closed form for normal components (Grimit et al. 2006) and
        Bernoulli ones (the Brier score), else the unbiased estimate from draws."""
        y = self.check_targets(y)
        if self.gaussian:
            return gaussian_mixture_crps(y, *self._component_moments(), weights=self.weights)
        z = (y - self.y_mean) / self.y_std
        if self.binary:
            p = self._bernoulli_p()
            return self.y_std * (p - binary_labels(z).to(p.dtype)).square()
        self._refuse_categorical("crps")
        return self.y_std * self._over_draws(
            lambda draws, points, w: sample_crps(z[points], draws, w))

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """``(..., N)`` mixture CDF at ``y`` (broadcast against ``(N,)``)."""
        y = torch.as_tensor(y, dtype=self.dtype, device=self.device)
        if self.gaussian:
            return gaussian_mixture_cdf(y, *self._component_moments(), self.weights)
        z = (y - self.y_mean) / self.y_std
        z = z.expand(*z.shape[:-1], self.num_points)
        if self.binary:
            return bernoulli_cdf(z, self._bernoulli_p())
        self._refuse_categorical("cdf")
        return self._over_draws(lambda draws, points, w: sample_cdf(z[..., points], draws, w))

    def quantiles(self, q, iters: int = 60) -> torch.Tensor:
        """``(Q, N)`` quantiles for probabilities ``q``: bisection on a normal mixture's CDF,
        ``inf {y : F(y) >= q}`` of a Bernoulli one, else quantiles of the draws (values of
        the support: whole numbers for counts)."""
        q = torch.as_tensor(q, dtype=self.dtype, device=self.device).reshape(-1, 1)
        if not bool(((q > 0) & (q < 1)).all()):
            raise ValueError("quantile probabilities must lie in (0, 1)")
        if self.gaussian:
            return gaussian_mixture_quantiles(q, *self._component_moments(), self.weights, iters)
        if self.binary:
            z = bernoulli_quantiles(q, self._bernoulli_p())
        else:
            self._refuse_categorical("quantiles")
            z = self._over_draws(lambda draws, _, w: sample_quantiles(q.reshape(-1), draws, w))
        return self.y_mean + self.y_std * z

    def _refuse_categorical(self, what: str) -> None:
        if self.categorical:
            raise ValueError(f"{what} needs ordered values of y; class labels have none: score "
                             "a categorical predictive with metrics.classification_report")


def _check_component(part: Distribution, first: Distribution) -> None:
    """A component has batch shape ``(S, n)``, event shape ``()``, and the first's type and
    ``S``."""
    if not isinstance(part, Distribution):
        raise TypeError(f"DrawMixturePredictive: components must be torch distributions, got "
                        f"{type(part).__name__}")
    if part.event_shape != () or len(part.batch_shape) != 2:
        raise ValueError(
            f"DrawMixturePredictive: each component must have batch shape (S, n) and event "
            f"shape () (one y per draw and point), got batch {tuple(part.batch_shape)} and "
            f"event {tuple(part.event_shape)}")
    if type(part) is not type(first) or part.batch_shape[0] != first.batch_shape[0]:
        raise ValueError("DrawMixturePredictive: the parts must be of one distribution type and "
                         "one number of draws S")
