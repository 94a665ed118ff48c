"""Mean-field Gaussian guide over layers (DSVI: Salimbeni and Deisenroth 2017, eq. 12)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from pyro.distributions import constraints
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam

from ...validation import check_positive_finite
from .. import estimators
from ..base import GuideRun, LayerGuide
from ..blocks import GaussianBlocks
from ..gaussian import LayerGaussian, initial_scale_tril, mvn_site
from ..params import copy_into, holder_and_leaf, preconditioned_cholesky, unconstrained_tril
from ..prototype import LayerSite
from ..registry import register_guide

__all__ = ["MeanField"]


@dataclass
class MeanFieldRun(GuideRun):
    """One run of :class:`MeanField`: ``q(u)`` as read at its ``.u`` sites (reused by its
    ``.f`` sites: each read is two ``pyro.param`` statements and the map from the stored
    factor), and per-point draws ``(..., N, D, M)`` of ``u`` by layer index."""

    q: dict = field(default_factory=dict)
    point_u: dict = field(default_factory=dict)


@register_guide("meanfield-sampled", "mean-field Gaussian per layer, sampled-u estimator",
                collapsed=False)
@register_guide("meanfield", "mean-field Gaussian per layer, collapsed estimator (DSVI)")
class MeanField(GaussianBlocks, LayerGuide):
    """``q(U) = prod_l prod_d N(u^l_d; m^l_d, S^l_d)``, a full ``M x M`` covariance per output.

    Estimators of ``E_q log p(y | f^L)``:

    - ``collapsed=True`` (DSVI eq. 15): ``u^l`` is integrated out per point, so ``f^l`` is drawn
      from the univariate marginals ``N(a^T m, k - a^T (K - S) a)``, ``a = K^-1 k_Z(x)``.
      Unbiased because ``q(u^l)`` is Gaussian and independent of the layers below, so this
      marginal is exactly the law of ``f^l`` given ``f^{l-1}`` under the guide.
    - ``collapsed=False``: the sampled-u estimator; ``f^l`` is drawn from the model's
      conditional given the sampled ``u^l``.

    Either way the last layer's Gaussian is handed to the likelihood, which scores its
    expectation in closed form (Gaussian) or by Gauss-Hermite.

    Initialisation: ``m`` the prior mean; ``S = inner_variance I`` for inner layers and ``I`` for
    the last, in whitened coordinates (unwhitened: ``inner_variance K_ZZ`` and ``K_ZZ``). The
    default ``inner_variance = 0.01`` is the start of :class:`Coupled` and :class:`Chain`: from
    the prior (``inner_variance=1``) MeanField mostly ended in the fit that explains the targets
    as noise on the compositional toy of Ustyuzhaninov et al. 2020, and on seven UCI sets the two
    starts were level (``benchmarks/results/history.md``, "MeanField's start: the prior against
    0.01"). Salimbeni and Deisenroth 2017 start the inner layers at ``1e-5`` (nearly
    deterministic), which ``inner_variance=1e-5`` reproduces.

    Layers whose ``u`` holds function values (``function_values=True``, e.g. the
    inducing-as-locations model of Ustyuzhaninov et al. 2020, §4.2) are unwhitened in the model,
    and Adam on an
    unwhitened ``(m, S)`` against a near-singular ``K_ZZ`` makes the KL diverge. With
    ``whiten_function_values=True`` (default) ``q`` keeps the same family but is
    parameterised relative to the layer's reference inducing inputs ``Z_ref``:
    ``m = mu(Z_ref) + L_ref m~``, ``S^(1/2) = L_ref S~^(1/2)`` with ``L_ref L_ref^T = K(Z_ref)``.
    ``Z_ref`` is the layer's ``Z`` or, where the layer below feeds its inducing inputs, the
    guide's mean of that layer's ``u`` (a deterministic function of the guide's parameters,
    so ``q`` stays a fixed Gaussian and the ELBO is unchanged; only the optimiser's geometry
    is). ``q_params`` always returns the unwhitened ``(m, S^(1/2))``.

    A whitened layer at random inducing inputs (the non-centred last layer of the locations
    model, see :class:`~pyro_dgp.DeepGP`) needs nothing of this: its ``q(v)`` is stored as is,
    its KL is ``KL(q(v) || N(0, I))``, and its conditional uses each draw's ``chol K(Z)``.

    In the inducing-as-locations model a layer whose ``u`` is the next layer's inducing inputs
    cannot be collapsed: ``f`` there is drawn given a sampled ``u``. With ``per_point=True``
    (default) that ``u`` is drawn independently for each data point, and the next layer uses
    that point's draw as its inducing inputs (one ``M x M`` Cholesky factor per point,
    ``O(N M^3)``). Unbiased, since the expected log-likelihood is a sum over points of
    expectations under the same ``q``. One draw shared by all points moves every point's
    gradient at once, so per-point draws lower the gradient's variance (measured on the
    compositional toy of Ustyuzhaninov et al. 2020: ``benchmarks/results/history.md``,
    "Per-point draws: the gradient's variance (MeanField)"). (The ``KL`` of
    the next layer, ``E_q(u) KL(q(u') || p(u' | u))``, is estimated with the shared draw of
    the ``<layer>.u`` site.) Sample paths need :meth:`shared_draws`, as for the joint guides.

    Valid with ``Trace_ELBO`` and ``TraceMeanField_ELBO`` (analytic KL). ``RenyiELBO`` needs
    each draw's own importance weight, so only ``collapsed=False`` without per-point draws: a
    collapsed ``f`` is drawn from ``q(f)``, not given the sampled ``u``, which leaves the
    ELBO's expectation unchanged but not ``E[w^(1 - alpha)]`` (at the exact posterior of a
    one-layer GP the collapsed RenyiELBO exceeds ``log p(y)``:
    tests/infer/test_elbo_known_answers.py).
    ``pyro_dgp.fit`` refuses the combination (:attr:`per_draw_weights`). With
    ``collapsed=False`` the weights are exact inside :func:`pyro_dgp.importance_weights`
    (``fit``'s ``"renyi"`` objective runs there; see :mod:`pyro_dgp.importance`).
    """

    mean_field = True

    def __init__(self, model, collapsed: bool = True, inner_variance: float = 0.01,
                 whiten_function_values: bool = True, per_point: bool = True, name=None):
        super().__init__(model, name=name)
        self.inner_variance = check_positive_finite(inner_variance, "MeanField: inner_variance")
        self.collapsed = bool(collapsed)
        self.whiten_function_values = bool(whiten_function_values)
        self.per_point = bool(per_point)
        self.locs = PyroModule()
        self.scale_trils = PyroModule()

    @property
    def per_draw_weights(self) -> bool:
        if self.collapsed:  # read at every '.f' site of a run: the common case first
            return False
        model = self.model
        layers = [s.layer for s in self.layer_sites] or (  # before the first call: the model's
            list(model.modules()) if isinstance(model, torch.nn.Module) else [])
        per_point_u = self.per_point and any(
            getattr(layer, "feeds_inducing_inputs", False) for layer in layers)
        return not self.collapsed and not per_point_u

    def export_attrs(self) -> dict[str, str | int]:
        return {**super().export_attrs(), "collapsed": int(self.collapsed)}

    def _reparameterised(self, site: LayerSite) -> bool:
        """Whether ``q(u)`` at ``site`` is stored relative to ``K(Z_ref)`` (see the class)."""
        return self.whiten_function_values and site.layer.function_values

    def _reference(self, site: LayerSite) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu(Z_ref)^T (D, M), L_ref (M, M))`` for a reparameterised site."""
        layer = site.layer
        below = self.layer_sites[site.index - 1] if site.index > 0 else None
        if below is not None and below.layer.feeds_inducing_inputs:
            run = self.current_run()
            q = run.q.get(below.name) if run is not None else None
            # (M, D_in): the mean of the layer below's u, as read at this run's site if any
            Z_ref = (q if q is not None else self.q_params(below))[0].mT
        else:
            Z_ref = layer.inducing_points
        L_ref = layer.cholesky_of(layer.kernel(Z_ref))
        return layer.mean_function(Z_ref).mT, L_ref

    def _setup_sites(self, sites: list[LayerSite]) -> None:
        self.__dict__["_holders"] = {}  # a plain attribute: no nn.Module bookkeeping
        for site in sites:
            layer = site.layer
            Z = layer.inducing_points.detach()
            D, M = site.shape
            if self._reparameterised(site):  # stored in whitened coordinates
                scale = 1.0 if site.is_last else math.sqrt(self.inner_variance)
                loc = Z.new_zeros(D, M)
                tril = scale * torch.eye(M, dtype=Z.dtype, device=Z.device)
            else:
                loc = layer.initial_u_loc()
                tril = initial_scale_tril(site, self.inner_variance)
            deep_setattr(self.locs, site.name, PyroParam(loc))
            # stored unconstrained (the tensor torch's lower-Cholesky transform would store);
            # _stored maps it to the factor and its log-determinant in one pass
            deep_setattr(self.scale_trils, site.name,
                         PyroParam(unconstrained_tril(tril.expand(D, M, M)), constraints.real))

    def _stored(self, site: LayerSite):
        """``(loc (D, M), scale_tril (D, M, M), log det of each row's covariance (D,) or
        None)`` as stored (or substituted)."""
        block = self.substituted_block(site.name)
        if block is not None:
            return (*block, None)
        trils, locs, leaf = self._holders_of(site.name)
        L, log_det = preconditioned_cholesky(getattr(trils, leaf))  # the factor read first
        return getattr(locs, leaf), L, log_det

    def _holders_of(self, name: str):
        """``(module holding the factor, module holding the mean, attribute name)`` of the
        site ``name``'s parameters, looked up on the first read after :meth:`setup`."""
        holders = self.__dict__.get("_holders")
        if holders is None:  # a guide pickled without the cache
            holders = self.__dict__["_holders"] = {}
        found = holders.get(name)
        if found is None:
            trils, leaf = holder_and_leaf(self.scale_trils, name)
            found = holders[name] = (trils, holder_and_leaf(self.locs, name)[0], leaf)
        return found

    def gaussian_blocks(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{"<layer>.u": (loc (D, M), scale_tril (D, M, M))}``: ``q(u)`` of each layer in its
        own parameterisation (:class:`~pyro_dgp.guides.blocks.GaussianBlocks`)."""
        self._ensure_set_up()
        bad = [s.name for s in self.layer_sites if self._reparameterised(s)]
        if bad:
            raise TypeError(f"MeanField: q(u) of {bad} is stored relative to K(Z_ref) "
                            "(whiten_function_values=True); its Gaussian blocks are not the "
                            "parameters: build the guide with whiten_function_values=False")
        with torch.no_grad():
            return {s.name: tuple(t.detach() for t in self._stored(s)[:2])
                    for s in self.layer_sites}

    def set_gaussian_blocks(self, blocks) -> None:
        for name, (loc, scale_tril) in blocks.items():
            self.set_q_params(name, loc, scale_tril)

    def last_block(self) -> str:
        self._ensure_set_up()
        return self.layer_sites[-1].name

    def q_params(self, site: LayerSite) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc (D, M), scale_tril (D, M, M))`` of ``q(u)`` at ``site``, in the layer's own
        (whitened or not) parameterisation of ``u``."""
        return self._q_and_log_det(site)[:2]

    def _q_and_log_det(self, site: LayerSite):
        """:meth:`q_params` and each row's ``log det S (D,)`` where it comes with the stored
        factor (else ``None``)."""
        loc, tril, log_det = self._stored(site)
        if not self._reparameterised(site):
            return loc, tril, log_det
        mean, L_ref = self._reference(site)
        return mean + (L_ref @ loc.unsqueeze(-1)).squeeze(-1), L_ref @ tril, None

    def set_q_params(self, site_name: str, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Overwrite the parameters of ``q(u)`` at ``site_name`` (e.g. ``"layer1.u"``): the
        lower-level writer behind :meth:`set_q`.

        :param loc: ``(D, M)``; :param scale_tril: ``(D, M, M)`` lower triangular, positive
            diagonal. Works in both Pyro parameter modes (global store or module-local).
        """
        site = self.site(site_name)
        if self._reparameterised(site):
            with torch.no_grad():
                mean, L_ref = self._reference(site)
                loc = torch.linalg.solve_triangular(
                    L_ref, (loc - mean).unsqueeze(-1), upper=False).squeeze(-1)
                scale_tril = torch.linalg.solve_triangular(L_ref, scale_tril, upper=False)
        copy_into(self.locs, site.name, loc, constraints.real)
        copy_into(self.scale_trils, site.name, unconstrained_tril(scale_tril), constraints.real)

    def layer_gaussian(self, site: LayerSite) -> LayerGaussian:
        loc, tril = self.q_params(site)
        return LayerGaussian(loc.reshape(-1), row_trils=tril)

    def _set_layer(self, site, loc, scale_tril):
        D, M = site.shape
        blocks = scale_tril.reshape(D, M, D, M).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        if not torch.equal(torch.block_diag(*blocks), scale_tril):
            raise ValueError(f"MeanField: q of layer '{site.name}' correlates the layer's "
                             f"{D} outputs; this family has independent rows of u")
        self.set_q_params(site.name, loc.reshape(D, M), blocks.contiguous())

    def new_run(self, *args, **kwargs) -> MeanFieldRun:
        return MeanFieldRun()

    def u_site(self, site, run):
        loc, scale_tril, log_det = self._q_and_log_det(site)
        run.q[site.name] = (loc, scale_tril)
        return mvn_site(loc, scale_tril, log_det)

    def _q_for_run(self, site: LayerSite, run: MeanFieldRun):
        q = run.q.get(site.name)
        return q if q is not None else self.q_params(site)

    def f_marginal(self, site, x, u, run):
        if self.collapsed:
            loc, scale_tril = self._q_for_run(site, run)
            return self._conditional_per_point_inputs(site, x, run, loc, scale_tril)
        return estimators.sampled(site, x, u)

    def f_given_u(self, site, x, u, run):
        if not self.per_point or self.draws_shared:
            return estimators.sampled(site, x, u)
        loc, scale_tril = self._q_for_run(site, run)
        eps = torch.randn(u.shape[:-2] + x.shape[-2:-1] + loc.shape, dtype=loc.dtype,
                          device=loc.device)
        u_points = loc + (scale_tril @ eps.unsqueeze(-1)).squeeze(-1)  # (..., N, D, M)
        out = self._conditional_per_point_inputs(site, x, run, u_points)
        run.point_u[site.index] = u_points
        return out

    def _conditional_per_point_inputs(self, site, x, run, loc, scale_tril=None):
        """``collapsed`` (or ``sampled`` at a draw ``loc``), or ``per_point`` where the layer
        below drew this layer's inducing inputs per point (or ``loc`` is per point)."""
        below = run.point_u.get(site.index - 1)
        if below is None and loc.dim() == 2:
            return estimators.collapsed(site, x, loc, scale_tril)
        return estimators.per_point(site, x, loc, scale_tril,
                                    None if below is None else below.mT)
