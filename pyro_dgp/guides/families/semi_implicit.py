"""``SemiImplicit``: structured semi-implicit guides over the inducing outputs (SSIVI,
Molchanova et al. 2019, eq. 32-35), and plain SIVI (Yin and Zhou 2018) over the same family.

The family is a chain of semi-implicit conditionals (:mod:`pyro_dgp.guides.mixing`):

    q(u^1..u^L) = q(u^1) prod_{l>=2} q(u^l | u^{l-1}),
    q(u^l | u^{l-1}) = int N(u^l | mu_l(eps^l, u^{l-1}), T_l diag sigma_l(eps^l, u^{l-1})^2 T_l^T)
                       N(eps^l | 0, I) d eps^l,

``mu_l, sigma_l`` one :class:`~pyro_dgp.guides.mixing.MixingNetwork` per layer, of the noise
and of ``vec u^{l-1}`` (in the layer below's own, whitened or not, coordinates), and ``T_l``
the identity (diagonal components, as the paper) or, with ``component_scale="tril"``, a
learned unit lower-triangular matrix per output shared by the components. ``log q`` is
intractable; each ``<layer>.u`` site scores its draw by the surrogate with ``K`` extra noise
draws, so Pyro's ``Trace_ELBO`` (and every objective that reads the guide's log-densities)
estimates the bound

    L_K = E log p(y | f) - sum_l E log [ (1/(K+1)) sum_k q(u^l | eps^l_k, u^{l-1}) / p(u^l) ]

(``structured=True``: SSIVI, eq. 35), or with ``structured=False`` the looser SIVI bound
whose ``logsumexp`` over ``k`` is of the sum over layers, ``eps_k = (eps^1_k, ..., eps^L_k)``
taken as one mixing variable. Both are lower bounds on the evidence that tighten as ``K``
grows, and for the same parameters ``E L_K(SSIVI) >= E L_K(SIVI)`` (Theorem 1).

Estimator of ``E_q log p(y | f^L)``: ``f^l`` of the inner layers is drawn from the model's
conditional given the drawn ``u^l`` (the sampled-u estimator). Given its noise ``eps^L_0``
and ``u^{L-1}``, ``u^L`` is Gaussian ``N(mu_L, T_L diag sigma_L^2 T_L^T)`` and independent of
``f^{L-1}``, so with ``collapse_last=True`` (default) the last layer's ``f^L`` is drawn from
the collapsed marginal with ``u^L`` integrated out (exact; lower variance), and its Gaussian
goes to the likelihood (analytic for a Gaussian likelihood). The drawn ``u^L`` still enters
the KL part. One ``U`` is drawn for all data points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger

from ...gp.distributions import drop_data_dim
from ...gp.sites import InducingSite, layer_site
from ...validation import check_positive_finite, check_positive_int
from .. import estimators
from ..base import GuideRun, LayerGuide
from ..gaussian import initial_scale_tril
from ..mixing import MixingNetwork, SemiImplicitNormal, surrogate_log_prob
from ..params import deep_getattr
from ..prototype import LayerSite
from ..registry import register_guide

__all__ = ["SemiImplicit"]


@dataclass
class LayerDraw:
    """One layer's ``.u`` in a run: its value (batch dims as sampled, the data plate's
    singleton kept) and the conditional that drew or was meant to draw it."""

    value: torch.Tensor | None = None
    dist: SemiImplicitNormal | None = None


@dataclass
class SemiImplicitRun(GuideRun):
    """One run of :class:`SemiImplicit`: the layers' draws by layer index."""

    draws: dict = field(default_factory=dict)


class _RecordInducing(Messenger):
    """Keeps the value of each ``<layer>.u`` site of a run once it is final: the guide's own
    draw, or a value replayed from another trace; the next layer's conditional reads it."""

    def __init__(self, guide: SemiImplicit):
        super().__init__()
        self.guide = guide

    def _pyro_post_sample(self, msg):
        if not isinstance(layer_site(msg), InducingSite):
            return
        run = self.guide.current_run()
        site = self.guide.find_site(msg["name"].rsplit(".", 1)[0])
        if run is None or site is None:
            return
        run.draws.setdefault(site.index, LayerDraw()).value = msg["value"]


@register_guide("ssivi-tril", "SSIVI whose components carry correlations: covariance "
                "T diag(sigma^2) T^T, T learned per layer", component_scale="tril")
@register_guide("sivi", "semi-implicit over the same family with the looser SIVI bound",
                structured=False)
@register_guide("ssivi", "structured semi-implicit: neural mixing per layer, conditioned on "
                "the layer below (SSIVI)")
class SemiImplicit(LayerGuide):
    """The semi-implicit guide of the module docstring.

    :param model: a :class:`~pyro_dgp.DeepGP` or a hand-written model of ``GPLayer``\\ s.
    :param structured: the SSIVI bound (logsumexp per layer, default) or, with ``False``,
        plain SIVI (one logsumexp over the sum of the layers' terms) over the same family.
    :param num_mixing: ``K``, the extra noise draws per layer of the surrogate (default
        100, as Molchanova et al. 2019).
    :param noise_dim: the size of each layer's noise ``eps^l`` (default 100, as the paper).
    :param hidden: the hidden widths of each layer's network (default three of 100, as
        the paper).
    :param inner_variance: the initial variance of ``q(u^l)`` of the inner layers, as for
        :class:`~pyro_dgp.guides.MeanField` (the last layer starts at the prior's scale).
    :param collapse_last: integrate the last layer's ``u`` out of ``f`` (module docstring).
    :param component_scale: ``"diagonal"`` (the paper's components, default) or ``"tril"``:
        each component's covariance ``T_l diag sigma_l^2 T_l^T`` with ``T_l`` learned (a
        ``(D, M, M)`` unit lower-triangular parameter per layer, starting at ``I``), so that
        the mixture's components carry the correlations of ``u^l``'s posterior and the
        family contains the Gaussian guides with full covariance per layer.

    At the start every network's output layer is zero, so ``q`` is the Gaussian
    ``prod_l N(m_l, diag s_l^2)`` with ``MeanField``'s initial means and marginal scales.
    Not ``mean_field`` (the KL has no closed form: train with ``Trace_ELBO``, ``fit``'s
    ``"elbo"``/``"auto"`` or the local alpha objective), and its runs are not importance
    weights (``log q`` is a surrogate), so ``RenyiELBO`` and the variational Pareto-k
    diagnostic are refused.
    """

    mean_field = False
    per_draw_weights = False
    #: why (:func:`~pyro_dgp.infer.importance.check_importance_weights` says it)
    no_weights_reason = ("its log q(u) has no closed form: it scores u by the surrogate of K "
                         "extra mixing draws, a bound, not the density")
    #: ``log q`` is intractable: the sites score the surrogate ``log q_K``
    tractable_log_q = False

    def __init__(self, model, structured: bool = True, num_mixing: int = 100,
                 noise_dim: int = 100, hidden: Sequence[int] = (100, 100, 100),
                 inner_variance: float = 1e-5, collapse_last: bool = True,
                 component_scale: str = "diagonal", name=None):
        super().__init__(model, name=name)
        if not isinstance(structured, bool):
            raise TypeError(f"SemiImplicit: structured must be True (SSIVI) or False (SIVI), "
                            f"got {structured!r}")
        self.structured = structured
        self.num_mixing = check_positive_int(num_mixing, "SemiImplicit: num_mixing")
        self.noise_dim = check_positive_int(noise_dim, "SemiImplicit: noise_dim")
        if isinstance(hidden, int) or not isinstance(hidden, Sequence) or not hidden:
            raise ValueError(f"SemiImplicit: hidden must be a non-empty sequence of layer "
                             f"widths, e.g. (100, 100, 100), got {hidden!r}")
        self.hidden = tuple(check_positive_int(h, "SemiImplicit: a hidden width")
                            for h in hidden)
        self.inner_variance = check_positive_finite(inner_variance,
                                                    "SemiImplicit: inner_variance")
        self.collapse_last = bool(collapse_last)
        if component_scale not in ("diagonal", "tril"):
            raise ValueError(f"SemiImplicit: component_scale must be 'diagonal' or 'tril', got "
                             f"{component_scale!r}")
        self.component_scale = component_scale
        self.nets = PyroModule()

    # ------------------------------------------------------------------- parameters
    def _setup_sites(self, sites: list[LayerSite]) -> None:
        for site in sites:
            loc = site.layer.initial_u_loc()
            # each entry's marginal scale of MeanField's initial q (rows of its factor)
            row_norms = initial_scale_tril(site, self.inner_variance).square().sum(-1).sqrt()
            scale = row_norms.expand(site.shape).clone()
            cond_dim = 0 if site.index == 0 else sites[site.index - 1].shape.numel()
            net = MixingNetwork(self.noise_dim, cond_dim, self.hidden, loc, scale,
                                correlated=self.component_scale == "tril")
            deep_setattr(self.nets, self._key(site), net)

    @staticmethod
    def _key(site: LayerSite) -> str:
        return site.name.rsplit(".", 1)[0]

    def mixing_network(self, layer: str) -> MixingNetwork:
        """The network ``(eps, vec u^{l-1}) -> (mu_l, sigma_l)`` of ``layer`` (a name such
        as ``"layer1"`` or its site ``"layer1.u"``)."""
        return deep_getattr(self.nets, self._key(self.site(layer)))

    # ------------------------------------------------------------------- runs
    def new_run(self, *args, **kwargs) -> SemiImplicitRun:
        return SemiImplicitRun()

    def u_site(self, site, run):
        """``q(u^l | u^{l-1})`` at the run's draw of the layer below."""
        cond = None
        if site.index > 0:
            below = run.draws.get(site.index - 1)
            if below is None or below.value is None:
                raise ValueError(
                    f"SemiImplicit: layer '{self._key(site)}' conditions on the inducing "
                    f"outputs of the layer sampled before it, which this run has not drawn "
                    f"(its f must be sampled before the next layer's u)")
            cond = below.value.flatten(-2)  # (*batch, D_{l-1} M_{l-1})
        record = LayerDraw()
        run.draws[site.index] = record

        def on_draw(d, value):
            record.dist, record.value = d, value

        net = deep_getattr(self.nets, self._key(site))
        like = net.body[-1].bias
        score = None if self.structured else self._sivi_score(site, run)
        q = SemiImplicitNormal(net, cond, self.noise_dim, self.num_mixing, site.shape,
                               score=score, on_draw=on_draw, like=like, unit_tril=net.unit_tril)
        record.dist = q
        return q

    def _sivi_score(self, site: LayerSite, run: SemiImplicitRun):
        """Plain SIVI: zero at the inner layers' sites; at the last, the surrogate of the
        whole chain, one logsumexp over ``k`` of the sum of every layer's component."""
        def score(d, value):
            if not site.is_last:
                return value.new_zeros(value.shape[:-2])
            parts = []
            for index in range(site.index):
                below = run.draws.get(index)
                if below is None or below.value is None:
                    raise ValueError("SemiImplicit(structured=False): the joint surrogate "
                                     f"needs every layer's draw; layer {index} has none")
                parts.append(below.dist.component_log_prob(below.value))
            return surrogate_log_prob([*parts, d.component_log_prob(value)])
        return score

    def f_marginal(self, site, x, u, run):
        """Inner layers, or a replayed ``u``: the model's conditional given ``u``. Last
        layer: ``u^L`` integrated out of its component ``N(mu_L(eps_0), T_L diag sigma_L(eps_0)^2
        T_L^T)``."""
        record = run.draws.get(site.index, LayerDraw())
        if self.collapse_last and site.is_last and record.dist is not None:
            own = record.dist.own_components(record.value)
            if own is not None:
                loc, scale = drop_data_dim(own[0]), drop_data_dim(own[1])
                return estimators.collapsed(site, x, loc, record.dist.scale_tril(scale))
        return estimators.sampled(site, x, u)

    def forward(self, *args, **kwargs):
        with _RecordInducing(self):
            return super().forward(*args, **kwargs)
