"""``LayerGuide``: the base of every guide; it runs the model with its layer sites redirected.

A guide must provide every latent site of the model (the site contract of ``docs/design.md``).
Rather than re-implement the model's composition of layers, a guide runs the model itself
under :class:`_Redirect`, a messenger that

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
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..gp.distributions import FunctionMarginal, FunctionPath, masked_out
from ..gp.kl import layer_gaussian_kl
from ..gp.sites import FunctionSite, InducingSite, drawn_site
from ..state import swapped
from ..validation import unique_name
from . import estimators
from .gaussian import LayerGaussian, check_size, gaussian_parameters
from .protocol import GuideProtocol
from .prototype import LayerSite, example_args, is_vectorising, prototype_sites
from .store import check_store, stored_names

__all__ = ["GuideRun", "LayerGuide"]


@dataclass
class GuideRun:
    """What one run (call) of a guide read and drew, for the sites of that run only; a family
    extends it with its own entries (:meth:`LayerGuide.new_run`).

    :ivar supplied: values of the model's other global latents drawn by the guide before the
        model runs (e.g. an inner autoguide's), by site name.
    """

    supplied: dict = field(default_factory=dict)


class _Redirect(Messenger):
    """Runs the model for ``guide`` (module docstring); holds the run's :class:`GuideRun`."""

    def __init__(self, guide: LayerGuide, run: GuideRun, model_view: list | None = None):
        super().__init__()
        self.guide, self.run = guide, run
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
        record = drawn_site(msg, self.guide)  # the model run on these draws must be its own
        site = self.guide.find_site(msg["name"].rsplit(".", 1)[0]) if record else None
        if record is not None and msg["is_observed"]:
            raise ValueError(
                f"{type(self.guide).__name__}: the layer site '{msg['name']}' is observed "
                "(poutine.condition?); a layer guide draws every layer's u and f itself, so "
                "conditioning them is not supported: give the layer fixed values instead")
        if isinstance(record, InducingSite):
            q = self.guide.u_site(site, self.run)
            if isinstance(q, torch.Tensor):  # drawn elsewhere: hidden, its density is there
                msg["value"], msg["is_observed"] = q, True
                return True
            msg["fn"], msg["is_observed"], msg["value"] = q, False, None
            return False
        if isinstance(record, FunctionSite):
            x, u = record.inputs, record.inducing
            if self.guide._paths_only:  # f jointly over x given the run's draw of u
                loc, var, scale_tril = estimators.path(site, x, u)
                msg["fn"] = masked_out(FunctionPath(
                    loc, var, scale_tril, per_output=bool(site.layer.kernel_outputs)))
                msg["is_observed"], msg["value"] = False, None
                return False
            if record.given_u_only:
                out = self.guide.f_given_u(site, x, u, self.run)
            else:
                out = self.guide.f_marginal(site, x, u, self.run)
            # given the run's own draws wherever this guide's runs are importance weights; a
            # family may return its own FunctionMarginal (e.g. draws at quadrature nodes)
            fn = out if isinstance(out, FunctionMarginal) else FunctionMarginal(
                *out, self.guide.per_draw_weights)
            msg["fn"] = masked_out(fn)
            msg["is_observed"], msg["value"] = False, None
            return False
        if msg["name"] in self.run.supplied:
            msg["value"], msg["is_observed"] = self.run.supplied[msg["name"]], True
        elif not msg["is_observed"] and all(is_vectorising(f) for f in msg["cond_indep_stack"]):
            raise ValueError(
                f"{type(self.guide).__name__}: the model's global latent site '{msg['name']}' "
                "is not covered by this guide; cover it with pyro_dgp.guides.complete("
                "AutoNormal(pyro_dgp.inducing_only(model)), model)")
        # An unobserved site inside a plate is not refused: it is how an observation looks
        # when the model predicts (obs=None). A hand-written model's own local latents are
        # therefore not covered by layer guides (they are drawn from the prior, hidden).
        return True


class LayerGuide(GuideProtocol, PyroModule):
    """Base class of the layer guides; subclasses define ``u_site`` and may override
    ``f_marginal``, and declare where they differ from the defaults of the guide protocol
    (:class:`~pyro_dgp.guides.protocol.GuideProtocol`: ``mean_field``, ``per_draw_weights``...).

    :param model: the Pyro model (a :class:`~pyro_dgp.DeepGP` or any model with GP layers);
        it is referenced, not registered as a submodule, so the guide's parameters are its own.
    """

    def __init__(self, model, name: str | None = None):
        if not callable(model):
            raise TypeError(f"{type(self).__name__}: model must be a callable Pyro model (e.g. a "
                            f"pyro_dgp.DeepGP), got {type(model).__name__}")
        super().__init__(name=name if name is not None else unique_name(type(self).__name__))
        self._model = (model,)
        self._sites: dict[str, LayerSite] = {}
        self._set_up = False
        self._shared_only = False
        self._paths_only = False
        self._model_view: list | None = None

    @property
    def model(self):
        return self._model[0]

    @property
    def layer_sites(self) -> list[LayerSite]:
        return list(self._sites.values())

    def setup(self, *args, **kwargs) -> None:
        """Create the variational parameters from a prototype trace (done on first call)."""
        stored = stored_names()  # before the prototype run adds the model's names
        sites, others = prototype_sites(self.model, *args, **kwargs)
        self._check_others(others)
        local = [s.name for s in sites if getattr(s.layer, "local_inducing", False)]
        if local and not self.supports_local_inducing:
            raise ValueError(f"{type(self).__name__}: the layers {local} have local inducing "
                             "outputs (one per data point); use pyro_dgp.guides.Amortized")
        self._sites = {s.name.rsplit(".", 1)[0]: s for s in sites}
        self._setup_sites(sites)
        self._set_up = True
        check_store(self, stored)  # that the guide and model read what was loaded for them

    def _check_others(self, others: list[str]) -> None:
        if others:
            raise ValueError(
                f"{type(self).__name__}: the model has global latent sites {others} that are not "
                "GP layer sites; cover them with pyro_dgp.guides.complete(AutoNormal("
                "pyro_dgp.inducing_only(model)), model)")

    def _setup_sites(self, sites: list[LayerSite]) -> None:
        pass

    # ------------------------------------------------------------- q in the layers' u-space
    def find_site(self, layer: str) -> LayerSite | None:
        """The :class:`LayerSite` of ``layer`` (``"layer1"``), ``None`` where this guide has
        none or is not set up yet (no setup happens)."""
        return self._sites.get(layer)

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
    def is_set_up(self) -> bool:
        """Whether the guide's parameters exist (it has run, or :meth:`q` / :meth:`set_q` set
        it up), so that a run draws nothing to create them."""
        return self._set_up

    @property
    def draws_shared(self) -> bool:
        """Whether runs now draw one ``U`` for all points (inside :meth:`shared_draws`)."""
        return self._shared_only

    @property
    def layer_names(self) -> list[str]:
        """The layers' names (site prefixes), in the order the model samples them."""
        self._ensure_set_up()
        return list(self._sites)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``torch.nn.Module.load_state_dict``, after setting a guide that has not run up from
        the model's ``example_args()``: its parameters are created lazily."""
        self._ensure_set_up()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def _ensure_set_up(self) -> None:
        if not self._set_up:
            with torch.random.fork_rng(devices=[]):  # a prototype run draws; keep the stream
                self.setup(*example_args(self.model))

    def layer_gaussian(self, site: LayerSite) -> LayerGaussian:
        """``q(vec u^l)`` of ``site`` as a :class:`LayerGaussian` (with the autograd graph of
        the parameters). Families whose ``q(u^l)`` is not Gaussian raise
        ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__}: q(u) is not Gaussian")

    def layer_kl(self, site: LayerSite | str, random_inducing: bool = False) -> torch.Tensor:
        """``KL(q(u^l) || p(u^l))`` of ``site`` (a layer's name or its record) in closed form
        (no gradient). With
        ``random_inducing`` the layer's prior is batched over draws of its inducing inputs
        (inside ``layer.given_inducing_inputs``) and the KL is averaged over them.

        :raises NotImplementedError: where ``q(u^l)`` is not Gaussian."""
        site = self.site(site) if isinstance(site, str) else site
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
            check_size(loc, site.shape.numel(), f"q of layer '{layer}'")
            with torch.no_grad():
                self._set_layer(site, loc, scale_tril)
            return
        self._ensure_set_up()
        check_size(loc, sum(s.shape.numel() for s in self.layer_sites), "the joint q")
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

    def u_site(self, site: LayerSite, run: GuideRun):
        """The distribution ``q(u)`` to sample at ``site`` (or a tensor drawn elsewhere)."""
        raise NotImplementedError

    def f_marginal(self, site: LayerSite, x: torch.Tensor, u: torch.Tensor, run: GuideRun):
        """``(loc, var)`` of ``f`` at the layer's inputs ``x``, each ``(..., N, D_out)``.

        Default, the sampled-u estimator: the model's own conditional ``p(f | u, f_prev)``,
        exact for any ``q(u)`` since ``u`` was drawn from ``q``.
        """
        return estimators.sampled(site, x, u)

    def f_given_u(self, site: LayerSite, x: torch.Tensor, u: torch.Tensor, run: GuideRun):
        """``(loc, var)`` of ``f`` at a layer whose ``u`` is also the next layer's inducing
        inputs, so ``f`` must be drawn given a ``u`` drawn from ``q`` (a collapsed ``f`` would
        lose its link to that input). Default: given the site's own draw ``u``."""
        return estimators.sampled(site, x, u)

    def forward(self, *args, **kwargs):
        if not self._set_up:
            self.setup(*args, **kwargs)
        with _Redirect(self, self.new_run(*args, **kwargs), self._model_view):
            self.model(*args, **kwargs)
        return {}

    def traces(self, *args, **kwargs) -> tuple[Trace, Trace]:
        """``(guide_trace, model_trace)`` from one run of the guide.

        The guide runs the model itself, so that run already meets every model site with the
        values ``poutine.replay(model, guide_trace)`` would give it: ``model_trace`` records
        each site as the model stated it (its own distribution, observed or latent, scale
        and mask from the model's plates) with the value it received. It equals the replayed
        model's trace for a model that, like every Pyro model, is deterministic given its
        sample values (``tests/infer/test_elbo_known_answers.py``), without running the model a
        second time. Handlers outside the guide do not see the model's hidden sites, so
        callers use it only where none is active (:class:`~pyro_dgp.elbo.AnalyticKL_ELBO`).
        Neither trace holds subsample sites (as after Pyro's ``prune_subsample_sites``).
        """
        view: list = []
        # a plain attribute (not a parameter, buffer or module): set without nn.Module's
        # checks; and the trace handler without poutine.trace's functools.update_wrapper, whose
        # look-ups of a module's missing __name__ and __qualname__ raise and catch errors
        self.__dict__["_model_view"] = view
        handler = TraceMessenger()(self)
        try:
            handler(*args, **kwargs)
        finally:
            self.__dict__["_model_view"] = None
        guide_trace = handler.trace  # the handler's own (get_trace would copy it)
        for name in [name for name, site in guide_trace.nodes.items()
                     if site["type"] == "sample" and site_is_subsample(site)]:
            guide_trace.remove_node(name)
        model_trace = Trace()
        for msg, site in view:
            site["value"] = msg["value"]  # final once the run is over
            model_trace.add_node(site["name"], **site)
        return guide_trace, model_trace

    def new_run(self, *args, **kwargs) -> GuideRun:
        """The record of a new run, made before the model runs (a family draws there what
        the run's sites share, e.g. joint samples)."""
        return GuideRun()

    def current_run(self) -> GuideRun | None:
        """The record of this guide's run in progress (its messenger on Pyro's stack), or
        ``None`` outside a run."""
        for m in reversed(_PYRO_STACK):
            if isinstance(m, _Redirect) and m.guide is self:
                return m.run
        return None

    @contextlib.contextmanager
    def shared_draws(self) -> Iterator[LayerGuide]:
        """Within this context every guide run draws one ``U`` for all data points, so the
        ``<layer>.f`` values of a trace are one composition of functions (sample paths), also
        for a guide that trains with per-point draws (``per_point``)."""
        with swapped(self, "_shared_only", True):
            yield self

    @contextlib.contextmanager
    def sample_paths(self) -> Iterator[LayerGuide]:
        """Within this context every guide run draws one ``U`` for all points
        (:meth:`shared_draws`) and each layer's ``f`` jointly over its inputs from the model's
        ``p(f | u, f_prev)`` at that draw, so a trace's ``<layer>.f`` values are one
        composition of functions, smooth where the kernels are (a collapsed estimator draws
        each point from its own marginal instead). ``O(N^3)`` per layer and draw."""
        with self.shared_draws(), swapped(self, "_paths_only", True):
            yield self

