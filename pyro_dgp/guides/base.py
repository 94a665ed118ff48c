"""``LayerGuide``: the base of every guide; it runs the model with its layer sites redirected.

A guide must provide every latent site of the model (DESIGN.md contract 2). Rather than
re-implement the model's composition of layers, a guide runs the model itself under
:class:`_Redirect`, a messenger that

- at ``<layer>.u`` replaces the prior by ``q(u)`` (or fixes a value drawn elsewhere, hidden),
- at ``<layer>.f`` replaces ``p(f | u, f_prev)`` by the guide's estimator ``N(loc, var)``
  (masked, and tagged with its marginal for the analytic last layer),
- hides every other site (observations, the likelihood), and refuses an unobserved global
  latent that no guide covers.

So one guide serves a :class:`~pyro_dgp.DeepGP` and any hand-written model built from
:class:`~pyro_dgp.GPLayer`\\ s, in the order and wiring the model itself uses.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..gp.distributions import FunctionMarginal, masked_out
from ..gp.kl import layer_gaussian_kl, triangular_of_rows
from ..gp.layer import GPLayer
from ..gp.sites import FunctionSite, InducingSite, inducing_site, layer_site
from ..validation import unique_name

__all__ = ["LayerGaussian", "LayerGuide", "LayerSite", "example_args", "mvn_site",
           "prototype_sites", "shared_draws"]

class LayerSite:
    """What a guide knows of one layer: its ``.u`` site name and the layer module."""

    def __init__(self, name: str, layer: GPLayer, index: int, is_last: bool):
        self.name, self.layer, self.index, self.is_last = name, layer, index, is_last

    @property
    def shape(self) -> torch.Size:
        return torch.Size([self.layer.output_dim, self.layer.num_inducing])


@dataclass(frozen=True)
class LayerGaussian:
    """A Gaussian ``q(vec u^l) = N(loc, Cov)`` of one layer's inducing outputs, ``vec``
    row-major over ``(D_out, M)``, with ``Cov`` given by a factor (never formed and
    refactorised, which would square the factor's condition number):

    :ivar loc: ``(D_out M,)``.
    :ivar row_trils: ``(D_out, M, M)`` lower Cholesky factors of independent rows, or
    :ivar rows: ``(D_out M, K)`` the rows of any factor, ``Cov = rows rows^T``.
    """

    loc: torch.Tensor
    row_trils: torch.Tensor | None = None
    rows: torch.Tensor | None = None

    def scale_tril(self) -> torch.Tensor:
        """``(D_out M, D_out M)`` lower Cholesky factor of ``Cov`` (positive diagonal)."""
        if self.row_trils is not None:
            return torch.block_diag(*self.row_trils)
        L = triangular_of_rows(self.rows)  # from a QR decomposition: diagonal of either sign
        return L * torch.sign(L.diagonal()).where(L.diagonal() != 0, 1.0)

    def distribution(self) -> dist.MultivariateNormal:
        """``N(loc, Cov)`` with detached parameters."""
        with torch.no_grad():
            return dist.MultivariateNormal(self.loc.detach().clone(),
                                           scale_tril=self.scale_tril().detach().clone())


def example_args(model) -> tuple:
    """Arguments for a prototype run of ``model`` before any data are seen: the model's own
    ``example_args()`` (a :class:`~pyro_dgp.DeepGP` gives one input row of zeros).

    :raises ValueError: naming the model where it has none.
    """
    method = getattr(model, "example_args", None)
    if method is None:
        raise ValueError(
            f"{type(model).__name__} has no example_args(): call the guide once with data "
            "(guide(X, y)) to create its parameters, or give the model an example_args() "
            "method returning arguments for one prototype run"
        )
    return tuple(method())


def _is_vectorising(frame) -> bool:
    return frame.name.startswith("_") or frame.name == "num_particles_vectorized"


def prototype_sites(model, *args, **kwargs):
    """Trace ``model`` once, isolated from any enclosing handlers.

    :returns: ``(layer_sites, other_latents)``: the layers in the order the model samples their
        ``.u`` sites, and the names of other unobserved sites outside every plate.
    """
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    us = [(n, s) for n, s in trace.nodes.items() if s["type"] == "sample" and inducing_site(s)]
    if not us:
        raise ValueError("the model has no GP layer (no '<layer>.u' site): nothing to guide")
    layer_sites = [
        LayerSite(n, inducing_site(s).layer, i, i == len(us) - 1) for i, (n, s) in enumerate(us)
    ]
    others = [
        n
        for n, s in trace.nodes.items()
        if s["type"] == "sample"
        and layer_site(s) is None
        and not s["is_observed"]
        and not s["cond_indep_stack"]
        and not site_is_subsample(s)
    ]
    return layer_sites, others


class _Redirect(Messenger):
    def __init__(self, guide: LayerGuide, model_view: list | None = None):
        super().__init__()
        self.guide = guide
        # (message, copy of the model's message before redirection) per site, or None
        self.model_view = model_view

    def _pyro_sample(self, msg):
        if site_is_subsample(msg):
            return
        if self.model_view is not None:
            self.model_view.append((msg, dict(msg)))
        # hide from the handlers outside the guide (its trace) what the guide does not sample,
        # as poutine.block would, without a second messenger on every message
        if self._redirect(msg):
            msg["stop"] = True

    def _redirect(self, msg) -> bool:
        """Redirect one site; returns whether to hide it from the guide's trace."""
        record = layer_site(msg)
        site = self.guide._sites.get(msg["name"].rsplit(".", 1)[0]) if record else None
        if record is not None and msg["is_observed"]:
            raise ValueError(
                f"{type(self.guide).__name__}: the layer site '{msg['name']}' is observed "
                "(poutine.condition?); a layer guide draws every layer's u and f itself, so "
                "conditioning them is not supported: give the layer fixed values instead"
            )
        if isinstance(record, InducingSite):
            q = self.guide.u_site(site)
            if isinstance(q, torch.Tensor):  # drawn elsewhere: hidden, its density is there
                msg["value"], msg["is_observed"] = q, True
                return True
            msg["fn"], msg["is_observed"], msg["value"] = q, False, None
            return False
        if isinstance(record, FunctionSite):
            x, u = record.inputs, record.inducing
            if record.given_u_only:
                loc, var = self.guide.f_given_u(site, x, u)
            else:
                loc, var = self.guide.f_marginal(site, x, u)
            # given the run's own draws wherever this guide's runs are importance weights
            msg["fn"] = masked_out(FunctionMarginal(loc, var, self.guide.per_draw_weights))
            msg["is_observed"], msg["value"] = False, None
            return False
        if msg["name"] in self.guide._supplied:
            msg["value"], msg["is_observed"] = self.guide._supplied[msg["name"]], True
        elif not msg["is_observed"] and all(_is_vectorising(f) for f in msg["cond_indep_stack"]):
            raise ValueError(
                f"{type(self.guide).__name__}: the model's global latent site '{msg['name']}' "
                "is not covered by this guide; cover it with pyro_dgp.guides.complete("
                "AutoNormal(pyro_dgp.inducing_only(model)), model)"
            )
        # An unobserved site inside a plate is not refused: it is how an observation looks
        # when the model predicts (obs=None). A hand-written model's own local latents are
        # therefore not covered by layer guides (they are drawn from the prior, hidden).
        return True


class LayerGuide(PyroModule):
    """Base class of the layer guides; subclasses define ``u_site`` and may override
    ``f_marginal``.

    :param model: the Pyro model (a :class:`~pyro_dgp.DeepGP` or any model with GP layers);
        it is referenced, not registered as a submodule, so the guide's parameters are its own.
    """

    #: TraceMeanField_ELBO is valid only if q factorises over layers like the prior does.
    mean_field = False
    #: Whether one run's ``log p(y, u) - log q(u)`` summed over its sites is an importance
    #: weight of that draw: every ``f`` drawn given the run's own ``u``, and every log-density
    #: the site's own (not a closed-form KL); the observation then scores ``log p(y | draw)``
    #: inside :func:`pyro_dgp.importance_weights` (:mod:`pyro_dgp.importance`). Objectives
    #: that are not linear in the log-weight (``RenyiELBO``) need it; the ELBO does not, and
    #: collapsed estimators rely on that.
    per_draw_weights = False

    def __init__(self, model, name: str | None = None):
        if not callable(model):
            raise TypeError(f"{type(self).__name__}: model must be a callable Pyro model (e.g. a "
                            f"pyro_dgp.DeepGP), got {type(model).__name__}")
        super().__init__(name=name if name is not None else unique_name(type(self).__name__))
        self._model = (model,)
        self._sites: dict[str, LayerSite] = {}
        self._supplied: dict[str, torch.Tensor] = {}
        self._set_up = False
        self._shared_only = False
        self._model_view: list | None = None

    @property
    def model(self):
        return self._model[0]

    @property
    def layer_sites(self) -> list[LayerSite]:
        return list(self._sites.values())

    def setup(self, *args, **kwargs) -> None:
        """Create the variational parameters from a prototype trace (done on first call)."""
        sites, others = prototype_sites(self.model, *args, **kwargs)
        self._check_others(others)
        self._sites = {s.name.rsplit(".", 1)[0]: s for s in sites}
        self._setup_sites(sites)
        self._set_up = True

    def _check_others(self, others: list[str]) -> None:
        if others:
            raise ValueError(
                f"{type(self).__name__}: the model has global latent sites {others} that are not "
                "GP layer sites; cover them with pyro_dgp.guides.complete(AutoNormal("
                "pyro_dgp.inducing_only(model)), model)"
            )

    def _setup_sites(self, sites: list[LayerSite]) -> None:
        pass

    # ------------------------------------------------------------- q in the layers' u-space
    def site(self, layer: str) -> LayerSite:
        """The :class:`LayerSite` of ``layer`` (its name ``"layer1"`` or site ``"layer1.u"``),
        setting the guide up from the model's ``example_args()`` if it has not run yet."""
        self._ensure_set_up()
        key = layer[:-2] if isinstance(layer, str) and layer.endswith(".u") else layer
        if key not in self._sites:
            raise KeyError(f"{type(self).__name__}: no GP layer {layer!r}; layers: "
                           f"{list(self._sites)}")
        return self._sites[key]

    @property
    def layer_names(self) -> list[str]:
        """The layers' names (site prefixes), in the order the model samples them."""
        self._ensure_set_up()
        return list(self._sites)

    def _ensure_set_up(self) -> None:
        if not self._set_up:
            with torch.random.fork_rng(devices=[]):  # a prototype run draws; keep the stream
                self.setup(*example_args(self.model))

    def layer_gaussian(self, site: LayerSite) -> LayerGaussian:
        """``q(vec u^l)`` of ``site`` as a :class:`LayerGaussian` (with the autograd graph of
        the parameters). Families whose ``q(u^l)`` is not Gaussian raise
        ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__}: q(u) is not Gaussian")

    def layer_kl(self, site: LayerSite, random_inducing: bool = False) -> torch.Tensor:
        """``KL(q(u^l) || p(u^l))`` of ``site`` in closed form (no gradient). With
        ``random_inducing`` the layer's prior is batched over draws of its inducing inputs
        (inside ``layer.given_inducing_inputs``) and the KL is averaged over them.

        :raises NotImplementedError: where ``q(u^l)`` is not Gaussian."""
        g = self.layer_gaussian(site)
        return layer_gaussian_kl(g.loc, site.layer, rows=g.rows, tril=g.row_trils,
                                 random_Z=random_inducing)

    def q(self, layer: str | None = None) -> torch.distributions.Distribution:
        """``q`` of one layer's ``vec(u^l)`` (row-major over ``(D_out, M)``), or with
        ``layer=None`` the joint over all layers' ``[vec u^1; ...; vec u^L]`` in the model's
        order, as a distribution with detached parameters. Usable right after construction
        for a model with ``example_args()`` (a :class:`~pyro_dgp.DeepGP`)."""
        if layer is not None:
            return self.layer_gaussian(self.site(layer)).distribution()
        self._ensure_set_up()
        return self._joint_q()

    def _joint_q(self) -> torch.distributions.Distribution:
        """The joint of independent layers (families that couple layers override it)."""
        parts = [self.layer_gaussian(site).distribution() for site in self.layer_sites]
        return dist.MultivariateNormal(
            torch.cat([p.loc for p in parts]),
            scale_tril=torch.block_diag(*[p.scale_tril for p in parts]))

    def set_q(self, q: torch.distributions.Distribution, layer: str | None = None) -> None:
        """Set ``q`` of one layer's ``vec(u^l)`` (``layer`` given) or the joint over all
        layers (``layer=None``) to the Gaussian ``q`` (a ``MultivariateNormal``, or an
        ``Independent`` of one over the rows of ``u^l``). A family that cannot represent ``q``
        (e.g. mean-field given correlated layers) raises ``ValueError`` saying why."""
        if isinstance(q, torch.distributions.LowRankMultivariateNormal) and self._set_low_rank(
                None if layer is None else self.site(layer), q):
            return
        loc, scale_tril = gaussian_parameters(q)
        if layer is not None:
            site = self.site(layer)
            _check_size(loc, site.shape.numel(), f"q of layer '{layer}'")
            with torch.no_grad():
                self._set_layer(site, loc, scale_tril)
            return
        self._ensure_set_up()
        _check_size(loc, sum(s.shape.numel() for s in self.layer_sites), "the joint q")
        with torch.no_grad():
            self._set_joint(loc, scale_tril)

    def _set_low_rank(self, site: LayerSite | None, q) -> bool:
        """Set a ``LowRankMultivariateNormal`` ``q`` in a family that stores that form (of
        ``site``, or the joint for ``None``); ``False`` to have it set as a full Gaussian."""
        return False

    def _set_layer(self, site: LayerSite, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot set q(u) of a layer")

    def _set_joint(self, loc: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Default: independent layers; the joint must be block diagonal over layers."""
        offset = 0
        for site in self.layer_sites:
            n = site.shape.numel()
            block = slice(offset, offset + n)
            cross = scale_tril[block, :offset]
            if cross.numel() and bool((cross != 0).any()):
                raise ValueError(
                    f"{type(self).__name__} has independent layers: the joint q correlates "
                    f"layer '{site.name}' with the layers before it")
            self._set_layer(site, loc[block], scale_tril[block, block])
            offset += n

    def u_site(self, site: LayerSite):
        """The distribution ``q(u)`` to sample at ``site`` (or a tensor drawn elsewhere)."""
        raise NotImplementedError

    def f_marginal(self, site: LayerSite, x: torch.Tensor, u: torch.Tensor):
        """``(loc, var)`` of ``f`` at the layer's inputs ``x``, each ``(..., N, D_out)``.

        Default, the sampled-u estimator: the model's own conditional ``p(f | u, f_prev)``,
        exact for any ``q(u)`` since ``u`` was drawn from ``q``.
        """
        return site.layer.conditional(x, u)

    def f_given_u(self, site: LayerSite, x: torch.Tensor, u: torch.Tensor):
        """``(loc, var)`` of ``f`` at a layer whose ``u`` is also the next layer's inducing
        inputs, so ``f`` must be drawn given a ``u`` drawn from ``q`` (a collapsed ``f`` would
        lose its link to that input). Default: given the site's own draw ``u``."""
        return site.layer.conditional(x, u)

    #: attributes holding only the latest run's values (left out of copies: :meth:`__getstate__`)
    _per_run: tuple[str, ...] = ()

    def __getstate__(self):
        """The state copied by ``copy.deepcopy``, ``pickle`` and ``torch.save``: without the
        last run's caches (:attr:`_per_run`; a dict cache is copied empty), which hold that
        run's autograd graph (non-leaf tensors cannot be deep-copied) and ``pyro.param``
        outputs carrying a weakref (not picklable). Each run rebuilds them.

        In Pyro's global parameter-store mode a copy of a ``PyroModule`` reads its parameters
        from the store by name, so it shares them with the original (Pyro's behaviour); for an
        independent snapshot use ``pyro.settings.set(module_local_params=True)`` or keep
        ``copy.deepcopy(guide.state_dict())``."""
        state = super().__getstate__()
        for key in self._per_run:
            if isinstance(state.get(key), dict):
                state[key] = {}
            else:
                state.pop(key, None)
        return state

    def forward(self, *args, **kwargs):
        if not self._set_up:
            self.setup(*args, **kwargs)
        self._before_run(*args, **kwargs)
        try:
            with _Redirect(self, self._model_view):
                self.model(*args, **kwargs)
        finally:
            self._supplied = {}
        return {}

    def traces(self, *args, **kwargs) -> tuple[Trace, Trace]:
        """``(guide_trace, model_trace)`` from one run of the guide.

        The guide runs the model itself, so that run already meets every model site with the
        values ``poutine.replay(model, guide_trace)`` would give it: ``model_trace`` records
        each site as the model stated it (its own distribution, observed or latent, scale
        and mask from the model's plates) with the value it received. It equals the replayed
        model's trace for a model that, like every Pyro model, is deterministic given its
        sample values (``tests/test_elbo_known_answers.py``), without running the model a
        second time. Handlers outside the guide do not see the model's hidden sites, so
        callers use it only where none is active (:class:`~pyro_dgp.elbo.AnalyticKL_ELBO`).
        """
        view: list = []
        self._model_view = view
        try:
            guide_trace = poutine.trace(self).get_trace(*args, **kwargs)
        finally:
            self._model_view = None
        model_trace = Trace()
        for msg, site in view:
            site["value"] = msg["value"]  # final once the run is over
            model_trace.add_node(site["name"], **site)
        return guide_trace, model_trace

    def _before_run(self, *args, **kwargs) -> None:
        """Hook: draw anything needed before the model runs (e.g. joint samples)."""

    def _running(self) -> bool:
        """Whether this guide's own run (its _Redirect messenger) is on Pyro's stack."""
        return any(getattr(m, "guide", None) is self for m in _PYRO_STACK)

    @contextlib.contextmanager
    def shared_draws(self) -> Iterator[LayerGuide]:
        """Within this context every guide run draws one ``U`` for all data points, so the
        ``<layer>.f`` values of a trace are one composition of functions (sample paths), also
        for a guide that trains with per-point draws (``per_point``)."""
        previous, self._shared_only = self._shared_only, True
        try:
            yield self
        finally:
            self._shared_only = previous


def gaussian_parameters(q) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loc (n,), scale_tril (n, n))`` of a Gaussian ``q`` over a vector: a
    ``MultivariateNormal`` (or ``LowRankMultivariateNormal``), or an ``Independent`` of
    multivariate normals over rows (flattened row-major, block diagonal)."""
    base, rows = q, None
    if isinstance(q, torch.distributions.Independent):
        base = q.base_dist
        rows = base.batch_shape
    if not isinstance(base, torch.distributions.MultivariateNormal |
                      torch.distributions.LowRankMultivariateNormal):
        raise TypeError(f"set_q: q must be a (Independent) MultivariateNormal, got "
                        f"{type(q).__name__}")
    with torch.no_grad():
        loc, tril = base.loc, base.scale_tril
        if rows is not None and len(rows):
            loc = loc.reshape(-1)
            tril = torch.block_diag(*tril.expand(rows + tril.shape[-2:]).reshape(
                (-1,) + tril.shape[-2:]))
        elif len(base.batch_shape):
            raise ValueError(f"set_q: q must be one distribution over a vector, got batch "
                             f"shape {tuple(base.batch_shape)}")
        return loc.detach().clone(), tril.detach().clone()


def _check_size(loc: torch.Tensor, size: int, what: str) -> None:
    if loc.shape[-1] != size:
        raise ValueError(f"set_q: {what} has {size} entries (D_out x M per layer), got a "
                         f"distribution over {loc.shape[-1]}")


def shared_draws(guide) -> contextlib.AbstractContextManager:
    """:meth:`LayerGuide.shared_draws` for a library guide; a no-op context for any other
    callable (e.g. a plain Pyro guide)."""
    method = getattr(guide, "shared_draws", None)
    return method() if method is not None else contextlib.nullcontext()


def initial_scale_tril(site: LayerSite, inner_variance: float) -> torch.Tensor:
    """``(M, M)`` Cholesky factor of the initial ``Cov q(u)`` of ``site`` (REFERENCE.md §3):
    ``c I`` in whitened coordinates, ``c = inner_variance`` for inner layers and ``1`` (the
    prior) for the last; mapped to an unwhitened layer's ``u`` as ``c K_ZZ``, not ``c I``,
    which against a near-singular ``K_ZZ`` would start the KL at ~``c tr(K_ZZ^-1)``."""
    layer = site.layer
    Z = layer.inducing_points.detach()
    scale = 1.0 if site.is_last else math.sqrt(inner_variance)
    if layer.whiten:
        return scale * torch.eye(Z.shape[-2], dtype=Z.dtype, device=Z.device)
    with torch.no_grad():
        return scale * layer.kzz_cholesky()


def log_density_of_noise(eps: torch.Tensor, log_det_cov: torch.Tensor) -> torch.Tensor:
    """``(*batch,)`` log-density of the Gaussian draw ``x = loc + L eps`` (``eps (*batch, n)``
    standard normal, ``log_det_cov = log det L L^T``), from its noise: ``-(n log 2 pi +
    log det + |eps|^2) / 2``, the general formula without its triangular solve."""
    return -0.5 * (eps.shape[-1] * math.log(2 * math.pi) + log_det_cov + eps.square().sum(-1))


class _OwnDrawMVN(dist.MultivariateNormal):
    """A multivariate normal that scores its latest draw ``x = loc + L e`` from ``e``.

    ``log q(x) = -|e|^2 / 2 - sum log diag L - M log(2 pi) / 2``, the same function of the
    parameters as the general formula (``L^-1 (x - loc) = e``), but without the triangular
    solve: a factor trained by Adam with off-diagonal entries above its diagonal (an inner
    layer's ``S = 1e-5 I`` after a few steps at lr 0.01, M = 100) can have ``cond(L)`` far
    beyond 1e15, and the solve then returns a meaningless ``log q`` at the guide's own draws,
    breaking Trace_ELBO, RenyiELBO and the importance weights of
    :func:`~pyro_dgp.variational_pareto_k`. Any other value is scored by the general formula.
    """

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        value = self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)
        self._own_draw = (value, eps)
        return value

    def log_prob(self, value):
        own = self.__dict__.get("_own_draw")
        if own is None or value is not own[0]:
            return super().log_prob(value)
        log_det = 2 * self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return log_density_of_noise(own[1], log_det)


def mvn_site(loc: torch.Tensor, scale_tril: torch.Tensor) -> dist.Distribution:
    """``q(u)`` with event shape ``(D, M)``: independent MVNs per output row."""
    return _OwnDrawMVN(loc, scale_tril=scale_tril).to_event(1)

