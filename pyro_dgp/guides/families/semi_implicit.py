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

Options (:mod:`pyro_dgp.guides.mixing` for the maths):

- ``bound="iwhvi"``: each layer's surrogate is the importance-weighted hierarchical bound of
  Sobolev and Vetrov (2019) with a learned Gaussian reverse model
  ``tau_l(eps^l | u^l, u^{l-1})`` (a :class:`~pyro_dgp.guides.mixing.ReverseNetwork`, trained
  by the same objective, which tightens the bound); it starts at ``N(0, I)``, where the
  bound is SIVI's.
- ``mixing="discrete"``: ``eps^l`` uniform over ``num_points`` learned points, so each
  conditional is an equal-weight mixture of Gaussians and ``log q`` is exact.
- ``init_from=guide``: start at a Gaussian guide's ``q(u)`` (see :class:`SemiImplicit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule

from ...gp.distributions import drop_data_dim
from ...validation import check_positive_finite, check_positive_int
from .. import estimators
from ..base import GuideRun, LayerGuide
from ..final_values import RecordFinalInducing
from ..gaussian import initial_scale_tril
from ..mixing import (
    DiscreteMixingNormal,
    MixingNetwork,
    ReverseNetwork,
    SemiImplicitNormal,
    surrogate_log_prob,
)
from ..params import deep_getattr
from ..protocol import protocol_of
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


def _keep_draw(run: SemiImplicitRun, index: int, value) -> None:
    """The next layer's conditional reads the final value of layer ``index``."""
    run.draws.setdefault(index, LayerDraw()).value = value


@register_guide("ssivi-discrete", "SSIVI whose mixing variable is uniform over 10 learned "
                "points per layer: a mixture of Gaussians with an exact log q",
                mixing="discrete")
@register_guide("ssivi-iwhvi", "SSIVI with the importance-weighted hierarchical bound "
                "(IWHVI): a learned reverse model per layer", bound="iwhvi")
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
    :param bound: ``"sivi"`` (default): each surrogate's ``K`` extra noises are drawn from
        the mixing distribution (Yin and Zhou 2018; per layer with ``structured``, as
        Molchanova et al. 2019); ``"iwhvi"``: they are drawn from a learned reverse model per
        layer and importance-weighted (Sobolev and Vetrov 2019; module docstring), a bound
        that is exact where the reverse model is ``q(eps^l | u^l, u^{l-1})``, at the same
        ``K = num_mixing``. The reverse models have one hidden layer of width ``hidden[0]``.
    :param mixing: ``"gaussian"`` (default: ``eps^l ~ N(0, I)``) or ``"discrete"``:
        ``eps^l`` uniform over ``num_points`` learned points
        (:class:`~pyro_dgp.guides.mixing.DiscreteMixingNormal`), each ``q(u^l | u^{l-1})``
        an equal-weight mixture of ``num_points`` Gaussians scored exactly (``num_mixing``
        and ``bound`` then do not apply; needs ``structured=True``, the chain's ``log q``
        being the sum of the layers' exact terms). The guide still declares
        ``tractable_log_q = False`` (a property of the family, which the registry reads).
    :param num_points: the number of points of ``mixing="discrete"`` (default 10).
    :param init_from: a trained Gaussian guide of the same model (``MeanField``,
        ``Coupled``...) to start from: each layer's network starts at the mean of that
        guide's ``q(u^l)`` for every noise and every ``u^{l-1}``, and its scales at that
        ``q(u^l)``'s marginal standard deviations (diagonal components) or, with
        ``component_scale="tril"``, at the Cholesky factor of each output's ``M x M`` block
        of its covariance (``T`` and the scales). Kept: the means, the marginal variances,
        and with ``"tril"`` the correlations within each output of a layer. Dropped: the
        correlations between outputs and between layers (``Coupled``, ``Chain``), which the
        networks can learn back through their input ``u^{l-1}``.

    At the start every network's output layer is zero, so ``q`` is the Gaussian
    ``prod_l N(m_l, diag s_l^2)`` with ``MeanField``'s initial means and marginal scales
    (or those of ``init_from``).
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
                 component_scale: str = "diagonal", bound: str = "sivi",
                 mixing: str = "gaussian", num_points: int = 10, init_from=None, name=None):
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
        self.bound = _check_choice(bound, "bound", ("sivi", "iwhvi"))
        self.mixing = _check_choice(mixing, "mixing", ("gaussian", "discrete"))
        self.num_points = check_positive_int(num_points, "SemiImplicit: num_points")
        if self.mixing == "discrete" and (bound != "sivi" or not structured):
            raise ValueError("SemiImplicit: mixing='discrete' scores each layer's log q "
                             "exactly; it takes no bound='iwhvi' and no structured=False (a "
                             "joint surrogate over the layers' noises); leave them at their "
                             "defaults")
        # the source's q(vec u^l) per layer, (loc, scale_tril), read now so that a bad
        # init_from is refused at construction
        self.start_from = _gaussian_start(init_from, model)
        self.nets = PyroModule()
        self.proposals = PyroModule()

    # ------------------------------------------------------------------- parameters
    def _setup_sites(self, sites: list[LayerSite]) -> None:
        for site in sites:
            loc = site.layer.initial_u_loc()
            start = self.start_from.get(self._key(site))
            correlated = self.component_scale == "tril"
            unit_tril = None
            if start is None:
                # each entry's marginal scale of MeanField's initial q (rows of its factor)
                rows = initial_scale_tril(site, self.inner_variance).square().sum(-1).sqrt()
                scale = rows.expand(site.shape).clone()
            else:
                loc, scale, unit_tril = _start_of(site, *start, like=loc,
                                                  correlated=correlated)
            cond_dim = 0 if site.index == 0 else sites[site.index - 1].shape.numel()
            net = MixingNetwork(self.noise_dim, cond_dim, self.hidden, loc, scale,
                                correlated=correlated,
                                num_points=self.num_points if self.mixing == "discrete"
                                else None)
            if unit_tril is not None:
                with torch.no_grad():
                    net.tril_raw.copy_(unit_tril)
            deep_setattr(self.nets, self._key(site), net)
            if self.bound == "iwhvi":
                proposal = ReverseNetwork(site.shape.numel(), cond_dim, self.noise_dim,
                                          self.hidden[:1], like=loc)
                deep_setattr(self.proposals, self._key(site), proposal)

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
        if self.mixing == "discrete":
            q = DiscreteMixingNormal(net, cond, net.points, site.shape, on_draw=on_draw,
                                     like=like, unit_tril=net.unit_tril)
        else:
            score = None if self.structured else self._sivi_score(site, run)
            proposal = deep_getattr(self.proposals, self._key(site)) \
                if self.bound == "iwhvi" else None
            q = SemiImplicitNormal(net, cond, self.noise_dim, self.num_mixing, site.shape,
                                   score=score, on_draw=on_draw, like=like,
                                   unit_tril=net.unit_tril, proposal=proposal)
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
        with RecordFinalInducing(self, _keep_draw):
            return super().forward(*args, **kwargs)


def _check_choice(value, label: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"SemiImplicit: {label} must be one of {list(choices)}, got "
                         f"{value!r}")
    return value


def _gaussian_start(guide, model) -> dict:
    """``{layer: (loc (D M,), scale_tril (D M, D M))}``, the Gaussian ``q(vec u^l)`` of each
    layer of ``guide`` (detached), after checking that it is a Gaussian guide of ``model``;
    ``{}`` for ``None``."""
    if guide is None:
        return {}
    answers = protocol_of(guide)
    if not answers.is_layer_guide:
        raise ValueError(f"SemiImplicit: init_from must be a Gaussian layer guide of the same "
                         f"model (e.g. pyro_dgp.guides.MeanField(model)), got "
                         f"{type(guide).__name__}")
    if answers.model is not model:
        raise ValueError("SemiImplicit: init_from is a guide of another model; pass a guide "
                         "trained on the model this SemiImplicit is built on")
    start = {}
    for layer in guide.layer_names:
        try:
            q = guide.q(layer)
        except NotImplementedError as error:
            raise ValueError(f"SemiImplicit: init_from must have a Gaussian q(u) per layer "
                             f"(MeanField, Coupled, Chain...); {type(guide).__name__} has "
                             f"none ({error})") from None
        start[layer] = (q.loc.detach(), q.scale_tril.detach())
    return start


def _start_of(site: LayerSite, loc: torch.Tensor, scale_tril: torch.Tensor,
              like: torch.Tensor, correlated: bool):
    """``(loc (D, M), scale (D, M), T (D, M, M) or None)`` of a network that starts at the
    Gaussian ``N(loc, scale_tril scale_tril^T)`` of ``vec u`` (row-major over ``(D, M)``),
    in ``like``'s dtype and device. Diagonal components (``correlated`` false): the marginal
    standard deviations, no ``T``. Correlated: each output's ``M x M`` block of the
    covariance, whose Cholesky factor is ``T diag(scale)``."""
    D, M = site.shape
    kw = {"dtype": like.dtype, "device": like.device}
    if loc.numel() != D * M:
        raise ValueError(f"SemiImplicit: init_from's q of layer '{site.name}' has "
                         f"{loc.numel()} entries, the layer's u has {D * M}")
    loc, scale_tril = loc.to(**kw).reshape(D, M), scale_tril.to(**kw)
    if not correlated:  # the rows' norms: sqrt of the covariance's diagonal
        return loc, scale_tril.square().sum(-1).sqrt().reshape(D, M), None
    cov = scale_tril @ scale_tril.mT
    blocks = cov.reshape(D, M, D, M).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (D, M, M)
    chol = torch.linalg.cholesky(blocks)
    scale = chol.diagonal(dim1=-2, dim2=-1)  # (D, M)
    return loc, scale, chol / scale.unsqueeze(-2)
