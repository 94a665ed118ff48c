"""``Mixture``: a finite mixture of Gaussian guides of one family over the same model,

    q(U) = sum_k pi_k q_k(U),    pi = softmax(logits),

``U = (u^1, ..., u^L)`` every layer's inducing outputs and each ``q_k`` a guide of one Gaussian
family (:class:`~pyro_dgp.guides.MeanField`, :class:`~pyro_dgp.guides.Coupled`,
:class:`~pyro_dgp.guides.Chain`) built on the unchanged model. ``log q(U) = logsumexp_k
(log pi_k + log q_k(U))`` is tractable, so every diagnostic that reads ``log q`` (PSIS, the
importance weights) works as for one Gaussian. The mixture does not factorise over layers
(``log q(U)`` is no sum of per-layer terms), so its ``<layer>.u`` sites score ``0`` except the
last, which scores the whole ``log q(U)`` of the run's draw: a trace's log-densities sum to
``log q(U)``, as Pyro's ELBOs and :func:`~pyro_dgp.diagnostics.variational_pareto_k` read them.

A run of the guide draws one component per draw (``k ~ Categorical(pi)``, one per entry of the
plates' batch: per Pyro particle, per predictive draw), then that component's ``U`` and its own
estimator of ``f`` (collapsed where the family collapses). That is a draw of ``q(U)``, and the
predictive (:func:`~pyro_dgp.predict`) is the mixture of the components' predictives. The
choice of ``k`` is not reparameterised, so a plain ``Trace_ELBO`` gives the weights ``pi`` no
gradient through it: train with the stratified objectives of :mod:`pyro_dgp.infer.mixture`
(``fit``'s default for this guide), which run each component in turn (:meth:`component`).

Components start apart: component 0 at the family's own start, component ``k >= 1`` with its
means moved by ``spread`` times a draw of the prior ``p(u^l)`` of every layer, seeded by
``seed + k``, and every component narrower than that spread in its inner layers
(``inner_variance``, 0.01 by default). On the two-mode toy
(:func:`pyro_dgp.gold.two_mode_model`), K = 4 MeanField components started at the prior all
ended in one mode; started at ``inner_variance = 0.01``, one of them ended in the other mode
(numbers in :mod:`pyro_dgp.infer.mixture`).

Or components start at ``K`` trained Gaussian guides of the same model (``init_from=[guide_1,
..., guide_K]``, e.g. independent fits from different seeds that landed in different modes):
component ``k`` is set to ``guide_k``'s ``q(U)`` and the weights start uniform, so before
training ``q(U) = (1/K) sum_k q_{guide_k}(U)``. The stratified ELBO's optimal weights are
``pi_k ∝ exp(ELBO_k)`` for components that do not overlap, so a mode's weight goes as the
exponential of the ELBO of its components' sub-mixture, whose entropy grows with the number of
distinct components in it: start with as many guides in each mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from ...rng import seeded
from ...state import swapped
from ...validation import check_bool, check_positive_finite, check_positive_int
from .. import estimators
from ..base import LayerGuide
from ..final_values import RecordFinalInducing
from ..mixture_runs import (
    MixtureInducing,
    MixtureRun,
    component_log_q,
    keep_value,
    starts_of_guides,
)
from ..params import copy_into
from ..prototype import LayerSite
from ..registry import register_guide
from .chain import Chain
from .coupled import Coupled
from .meanfield import MeanField

__all__ = ["MIXTURE_FAMILIES", "Mixture", "component_log_q"]



@register_guide("mixture", "a mixture of 4 mean-field Gaussians with learned weights, trained by "
                "the stratified ELBO (Morningstar et al. 2021)")
class Mixture(LayerGuide):
    """A mixture of ``num_components`` guides of one Gaussian family (module docstring).

    :param model: a :class:`~pyro_dgp.DeepGP` or a hand-written model of ``GPLayer``\\ s.
    :param family: a name of :data:`MIXTURE_FAMILIES` (the registry's Gaussian families), or a
        function ``model -> guide`` that builds one component (e.g.
        ``lambda m: MeanField(m, inner_variance=1e-5)``), of a family with a Gaussian ``q(U)``.
    :param inner_variance: the initial variance of each component's inner layers (whitened,
        as the families' own ``inner_variance``); ``None``: the family's own start
        (``0.01``). Not used with a builder ``family``.
    :param num_components: ``K >= 1``.
    :param learn_weights: learn ``pi`` (its logits, starting uniform); ``False`` keeps it
        uniform.
    :param spread: the scale of the prior draws that move the means of components ``1..K-1``
        at the start (``0``: every component starts at the family's start).
    :param seed: component ``k`` draws its start from ``seed + k``.
    :param init_from: a list of ``K`` trained Gaussian guides of ``model`` (module docstring):
        component ``k`` starts at ``init_from[k].q()``, the means not moved (``spread`` and
        ``inner_variance`` unused), ``K`` their number (``num_components``, if given, must
        equal it). ``family`` must represent their ``q`` (``"meanfield"`` for MeanField
        guides, ``"coupled"`` or ``"chain"`` for those).

    Not ``mean_field`` (no closed-form KL of a mixture). ``per_draw_weights`` where the
    components' are (``family="meanfield-sampled"``); the SIWAE objective draws ``f`` given
    ``U`` itself, whatever the family.
    """

    mean_field = False
    #: fit's "auto": the stratified mixture ELBO (:mod:`pyro_dgp.infer.mixture`)
    default_objective = "stratified"

    def __init__(self, model, family: str | Callable = "meanfield",
                 num_components: int | None = None, learn_weights: bool = True,
                 spread: float = 1.0, seed: int = 0, inner_variance: float | None = None,
                 init_from=None, name=None):
        super().__init__(model, name=name)
        # detached distributions, not modules: the sources' parameters stay theirs
        self.starts = None if init_from is None else starts_of_guides(init_from, model)
        self.count = _count(num_components, self.starts)
        self.learn_weights = check_bool(learn_weights, "Mixture: learn_weights")
        self.spread = 0.0 if spread == 0 else check_positive_finite(spread, "Mixture: spread")
        self.seed = int(seed)
        if inner_variance is not None:
            inner_variance = check_positive_finite(inner_variance, "Mixture: inner_variance")
        self.family = family
        self.components = PyroModule[torch.nn.ModuleList](
            [_build_component(family, model, inner_variance)
             for _ in range(self.num_components)])
        self._component: int | None = None  # draw every draw from this component only
        self._sampled_f = False  # every f from the model's conditional given the run's u

    @property
    def num_components(self) -> int:
        return self.count

    @property
    def only_its_objective(self) -> bool:
        return self.learn_weights  # each draw's component is chosen, not reparameterised

    # ------------------------------------------------------------------- parameters
    @property
    def per_draw_weights(self) -> bool:
        return self._sampled_f or all(c.per_draw_weights for c in self.components)

    def setup(self, *args, **kwargs) -> None:
        for component in self.components:
            if not component.is_set_up:
                component.setup(*args, **kwargs)
        super().setup(*args, **kwargs)

    def _setup_sites(self, sites: list[LayerSite]) -> None:
        like = sites[0].layer.inducing_points
        logits = torch.zeros(self.num_components, dtype=like.dtype, device=like.device)
        if self.learn_weights:
            self.logits = PyroParam(logits)
        else:
            self.register_buffer("logits", logits)
        for k, component in enumerate(self.components):
            if self.starts is not None:
                _start_at(component, self.starts[k], k)
            elif k > 0 and self.spread > 0:
                self._move_means(component, self.seed + k, like.device)

    def _move_means(self, component: LayerGuide, seed: int, device) -> None:
        """Move ``component``'s means by ``spread`` times a prior draw of every layer."""
        with torch.no_grad(), seeded(seed, device):
            shift = torch.cat([s.layer.prior().sample().reshape(-1)
                               for s in component.layer_sites])
            q = component.q()
            loc = q.loc + self.spread * shift
            if isinstance(q, torch.distributions.LowRankMultivariateNormal):
                moved = dist.LowRankMultivariateNormal(loc, q.cov_factor, q.cov_diag)
            else:
                moved = dist.MultivariateNormal(loc, scale_tril=q.scale_tril)
            component.set_q(moved)

    def weights(self) -> torch.Tensor:
        """``(K,)`` the mixture weights ``pi``, detached."""
        self._ensure_set_up()
        with torch.no_grad():
            return self.mixture_log_weights().exp()

    def set_weights(self, weights) -> None:
        """Set ``pi`` to ``weights`` (``(K,)``, positive, summing to one)."""
        self._ensure_set_up()
        w = torch.as_tensor(weights, dtype=self.logits.dtype, device=self.logits.device)
        if w.shape != (self.num_components,) or not bool((w > 0).all()) or not bool(
                torch.isclose(w.sum(), w.new_ones(()))):
            raise ValueError(f"Mixture.set_weights: weights must be {self.num_components} "
                             f"positive numbers summing to one, got {w.tolist()}")
        with torch.no_grad():
            if self.learn_weights:
                copy_into(self, "logits", w.log(), constraints.real)
            else:
                self.logits.copy_(w.log())

    def mixture_log_weights(self) -> torch.Tensor:
        """``(K,)`` ``log pi`` with the logits' autograd graph."""
        self._ensure_set_up()
        return torch.log_softmax(self.logits, dim=-1)

    def log_q(self, values: list[torch.Tensor]) -> torch.Tensor:
        """``(*batch,)`` ``log q(U) = logsumexp_k (log pi_k + log q_k(U))`` at every layer's
        value ``values[l] (*batch, D_l, M_l)``, in the model's order (with autograd graph)."""
        log_pi = self.mixture_log_weights()
        terms = [log_pi[k] + component_log_q(c, values) for k, c in enumerate(self.components)]
        return torch.logsumexp(torch.stack(terms), dim=0)

    def layer_kl(self, site: LayerSite | str, random_inducing: bool = False,
                 num_draws: int = 1024) -> torch.Tensor:
        """``KL(q(u^l) || p(u^l))`` of one layer's marginal ``q(u^l) = sum_k pi_k q_k(u^l)``,
        by stratified Monte Carlo (no closed form for a mixture): ``sum_k pi_k mean_s [log
        q(u_ks) - log p(u_ks)]`` over ``num_draws`` draws ``u_ks ~ q_k(u^l)`` of each
        component, from a fixed seed (the same number at every call; the global random state
        untouched). ``nan`` with ``random_inducing`` (a prior batched over draws of the
        inducing inputs), which this estimate does not cover."""
        site = self.site(site) if isinstance(site, str) else site
        like = site.layer.inducing_points
        if random_inducing:
            return torch.full((), float("nan"), dtype=like.dtype, device=like.device)
        parts = [c.layer_gaussian(c.site(site.name)).distribution() for c in self.components]
        log_pi = self.weights().log()
        kl = like.new_zeros(())
        with torch.no_grad(), seeded(0, like.device):
            for k, part in enumerate(parts):
                v = part.sample((num_draws,))  # (num_draws, D M)
                log_q = torch.logsumexp(torch.stack(
                    [log_pi[j] + parts[j].log_prob(v) for j in range(len(parts))]), dim=0)
                log_p = site.layer.prior().log_prob(v.reshape((num_draws,) + site.shape))
                kl = kl + log_pi[k].exp() * (log_q - log_p).mean()
        return kl

    # ------------------------------------------------------------------- modes of a run
    @contextlib.contextmanager
    def component(self, k: int) -> Iterator[Mixture]:
        """Within this context every run draws ``U`` (and ``f``) from component ``k`` only,
        still scored by the mixture's ``log q(U)``: one stratum of the stratified objectives."""
        if not 0 <= int(k) < self.num_components:
            raise ValueError(f"Mixture: component k must be in 0..{self.num_components - 1}, "
                             f"got {k}")
        with swapped(self, "_component", int(k)):
            yield self

    @contextlib.contextmanager
    def sampled_f(self) -> Iterator[Mixture]:
        """Within this context every ``f`` is drawn from the model's conditional given the run's
        ``u`` (the sampled-u estimator), so a run's log-densities are an importance weight
        (:func:`~pyro_dgp.importance_weights`), whatever the components' estimators."""
        with swapped(self, "_sampled_f", True):
            yield self

    @contextlib.contextmanager
    def shared_draws(self) -> Iterator[Mixture]:
        with contextlib.ExitStack() as stack:
            for component in self.components:
                stack.enter_context(component.shared_draws())
            stack.enter_context(super().shared_draws())
            yield self

    # ------------------------------------------------------------------- runs
    def _drawing(self) -> list[int]:
        return list(range(self.num_components)) if self._component is None else [self._component]

    def new_run(self, *args, **kwargs) -> MixtureRun:
        runs = [None] * self.num_components
        for k in self._drawing():
            runs[k] = self.components[k].new_run(*args, **kwargs)
        return MixtureRun(runs=runs)

    def u_site(self, site, run):
        return MixtureInducing(self, site, run)

    def _which(self, run: MixtureRun, batch_shape: torch.Size) -> torch.Tensor | None:
        """The component of each draw ``(*batch_shape)`` of a run (``None``: one component)."""
        if len(self._drawing()) == 1:
            return None
        if batch_shape not in run.which:
            logits = self.logits.detach()
            run.which[batch_shape] = dist.Categorical(logits=logits).sample(batch_shape)
        return run.which[batch_shape]

    def draw_u(self, site: LayerSite, run: MixtureRun, batch_shape: torch.Size) -> torch.Tensor:
        """``(*batch_shape, D, M)``: each draw's ``u`` of ``site`` from its own component."""
        values = {}
        for k in self._drawing():
            q = self.components[k].u_site(site, run.runs[k])
            if q.batch_shape != batch_shape:
                q = q.expand(batch_shape)
            values[k] = q.rsample()
        run.component_values[site.index] = values
        return self._select(values, self._which(run, batch_shape), 2)

    @staticmethod
    def _select(values: dict, which: torch.Tensor | None, event_dims: int):
        """Each draw's entry of ``values[k]`` for its component ``which`` (batch dims left of
        the last ``event_dims``); the one value where one component draws."""
        if which is None:
            return next(iter(values.values()))
        which = which.reshape(which.shape + (1,) * event_dims)
        out = values[0]
        for k in range(1, len(values)):
            out = torch.where(which == k, values[k], out)
        return out

    def _estimate(self, method: str, site, x, u, run: MixtureRun):
        own = run.component_values.get(site.index)
        if self._sampled_f or own is None:  # or u replayed: the sampled-u estimator is exact
            return estimators.sampled(site, x, u)
        # the layer hands u over as its site drew it less the data plate's singleton
        outs = {k: getattr(self.components[k], method)(site, x, v.reshape(u.shape), run.runs[k])
                for k, v in own.items()}
        if any(not isinstance(o, tuple) for o in outs.values()):
            raise TypeError("Mixture: a component's estimator of f must be (loc, var)")
        which = self._which(run, next(iter(own.values())).shape[:-2])
        if which is not None:
            which = which.reshape(u.shape[:-2])
        # f is (*batch, N, D_out): the draw's component broadcast over the points and outputs
        loc = self._select({k: o[0] for k, o in outs.items()}, which, 2)
        var = self._select({k: o[1] for k, o in outs.items()}, which, 2)
        return loc, var

    def f_marginal(self, site, x, u, run):
        """Each draw's ``f`` from its own component's estimator (the sampled-u estimator under
        :meth:`sampled_f`, or where ``u`` was replayed rather than drawn by this run)."""
        return self._estimate("f_marginal", site, x, u, run)

    def f_given_u(self, site, x, u, run):
        return self._estimate("f_given_u", site, x, u, run)

    def forward(self, *args, **kwargs):
        with RecordFinalInducing(self, keep_value):
            return super().forward(*args, **kwargs)


#: name -> (model, inner_variance) -> one component; ``inner_variance=None`` as the
#: family's default
_FAMILIES = {
    "meanfield": lambda m, v: MeanField(m, **_inner(v)),
    "meanfield-sampled": lambda m, v: MeanField(m, collapsed=False, **_inner(v)),
    "coupled": lambda m, v: Coupled(m, **_inner(v)),
    "coupled-per-point": lambda m, v: Coupled(m, per_point=True, **_inner(v)),
    "coupled-lowrank": lambda m, v: Coupled(m, rank=10, **_inner(v)),
    "chain": lambda m, v: Chain(m, **_inner(v)),
    "chain-per-point": lambda m, v: Chain(m, per_point=True, **_inner(v)),
}
#: the registry's families a mixture is made of: Gaussian ``q(U)`` with a tractable density,
#: each drawing ``u`` at its ``<layer>.u`` sites itself
MIXTURE_FAMILIES = tuple(_FAMILIES)


def _count(num_components: int | None, starts: list | None) -> int:
    """``K``: ``num_components`` (default 4), or the number of ``init_from``'s guides."""
    if starts is None:
        return check_positive_int(4 if num_components is None else num_components,
                                  "Mixture: num_components")
    if num_components is not None and num_components != len(starts):
        raise ValueError(f"Mixture: num_components ({num_components}) differs from the number "
                         f"of guides in init_from ({len(starts)}); leave num_components out")
    return len(starts)


def _start_at(component: LayerGuide, start, k: int) -> None:
    """Set ``component`` to the Gaussian ``start`` (init_from[k]'s ``q(U)``)."""
    try:
        component.set_q(start)
    except ValueError as error:
        raise ValueError(f"Mixture: init_from[{k}]'s q(U) cannot start a component of family "
                         f"{type(component).__name__} ({error}); pass the family of the guides "
                         "in init_from (e.g. family='coupled')") from None


def _inner(inner_variance: float | None) -> dict:
    return {} if inner_variance is None else {"inner_variance": inner_variance}


def _build_component(family, model, inner_variance: float | None) -> LayerGuide:
    """One component of ``family`` (a name of :data:`MIXTURE_FAMILIES` or a builder) on
    ``model``."""
    if isinstance(family, str):
        if family not in MIXTURE_FAMILIES:
            raise ValueError(
                f"Mixture: family must be one of {list(MIXTURE_FAMILIES)} (Gaussian guides "
                f"with a tractable log q(U)), or a function model -> guide; got {family!r}")
        return _FAMILIES[family](model, inner_variance)
    if not callable(family):
        raise TypeError(f"Mixture: family must be a name of {list(MIXTURE_FAMILIES)} or a "
                        f"function model -> guide, got {type(family).__name__}")
    component = family(model)
    if not isinstance(component, LayerGuide) or getattr(component, "model", None) is not model:
        raise TypeError(f"Mixture: family(model) must return a layer guide of that model "
                        f"(e.g. MeanField(model)), got {type(component).__name__}")
    if (type(component).layer_gaussian is LayerGuide.layer_gaussian
            or getattr(component, "tractable_log_q", True) is False
            or getattr(component, "supports_local_inducing", False)):
        raise ValueError(f"Mixture: family builds {type(component).__name__}, whose q(U) is not "
                         "a Gaussian with a tractable density; use one of "
                         f"{list(MIXTURE_FAMILIES)}")
    return component
