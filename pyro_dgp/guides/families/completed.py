"""Completing a guide over the ``.u`` sites (a Pyro autoguide, say) into a full DGP guide."""

from __future__ import annotations

import functools

import torch
from pyro import poutine
from pyro.infer import autoguide
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from ...gp.architectures import default_dtype
from ...gp.sites import function_site, inducing_site
from ..autoguide_gaussian import (
    autoguide_joint_gaussian,
    autoguide_layer_gaussians,
    set_autoguide_gaussian,
    set_autoguide_joint,
    set_autoguide_low_rank,
)
from ..base import GuideRun, LayerGuide
from ..gaussian import LayerGaussian
from ..prototype import LayerSite, example_args
from ..registry import register_guide

__all__ = ["AUTOGUIDES", "Completed", "complete", "inducing_only"]


class _Placeholder(Messenger):
    """Gives every ``.f`` site zeros of its shape, so no conditional is ever computed."""

    def _pyro_sample(self, msg):
        record = function_site(msg)
        if record is not None:
            fn = msg["fn"]
            msg["value"] = torch.zeros(fn.batch_shape + fn.event_shape,
                                       dtype=record.inducing.dtype, device=record.inducing.device)
            msg["is_observed"] = True


def _not_global_latent(msg) -> bool:
    if msg["type"] != "sample" or site_is_subsample(msg):
        return False
    if inducing_site(msg):
        return False
    return function_site(msg) is not None or msg["is_observed"] or bool(msg["cond_indep_stack"])


class InducingOnly:
    """The model restricted to its global latents: every ``.u`` site and any other latent
    outside the plates (e.g. a ``PyroSample`` hyperparameter). Function values, observations
    and local sites are hidden and never computed. Build autoguides on it."""

    def __init__(self, model):
        if not callable(model):
            raise TypeError(f"inducing_only: model must be a callable Pyro model, got "
                            f"{type(model).__name__}")
        self.model = model

    def __call__(self, *args, **kwargs):
        with poutine.block(hide_fn=_not_global_latent), _Placeholder():
            self.model(*args, **kwargs)


def inducing_only(model) -> InducingOnly:
    """See :class:`InducingOnly`."""
    return InducingOnly(model)


class Completed(LayerGuide):
    """``inner`` draws the ``.u`` sites (and any other global latents) with its own density;
    the ``.f`` sites come from the model's conditional given those draws (sampled-u estimator,
    unbiased for any ``q(u)``).

    Pyro's autoguides hand every site over as a ``Delta`` (the density sits on an auxiliary
    site), which has no closed-form KL, so TraceMeanField_ELBO computes exactly Trace_ELBO's
    estimate with them, valid for joint ones (AutoMultivariateNormal) too; it warns "Failed to
    verify mean field restriction" because ``inner`` draws every ``.u`` before the model's
    first ``.f`` (a check of site order, not of the estimate). An ``inner`` of your own that
    samples ``.u`` sites from Gaussians it correlates is not for TraceMeanField_ELBO.

    Every log-density is a site's own, so ``RenyiELBO`` is a valid bound too, with the
    observation scored by ``log p(y | draw)`` inside :func:`pyro_dgp.importance_weights` (see
    :attr:`~pyro_dgp.guides.base.LayerGuide.per_draw_weights` and :mod:`pyro_dgp.importance`).
    """

    per_draw_weights = True

    def __init__(self, inner, model, name=None):
        if not callable(inner):
            raise TypeError("complete: guide must be a callable Pyro guide over the inducing "
                            f"sites (e.g. an autoguide on inducing_only(model)), got "
                            f"{type(inner).__name__}")
        super().__init__(model, name=name)
        self.inner = inner
        self._inner_ready = False
        # the autoguide's model, held here too: copied and pickled with this guide
        self._inner_model = (inner.model,) if isinstance(inner, autoguide.AutoGuide) else None

    def _restore_inner_model(self) -> None:
        """Give a Pyro autoguide back its model: ``AutoGuide.__getstate__`` drops it, from the
        original as well as the copy, whenever the guide is copied or pickled
        (``copy.deepcopy((model, guide))``), and Pyro offers no public way to set it. A copy
        gets the model copied with it, the original its own."""
        if self._inner_model is not None:
            self.inner._model = self._inner_model

    def export_attrs(self) -> dict[str, str | int]:
        inner = type(self.inner).__name__
        return {"guide": f"{type(self).__name__}({inner})", "inner_guide": inner}

    def _check_others(self, others):
        pass  # the inner guide covers them; checked on every call in new_run

    def _prepare_inner(self, *args, **kwargs) -> None:
        """Build the inner guide's parameters. Autoguides build them (and nn modules, e.g.
        AutoIAFNormal's flows) in torch's default dtype: they are built with the model's dtype
        as the default (so their initial values are drawn in it, whatever the user's default),
        then moved to the model's device."""
        ref = self.layer_sites[0].layer.inducing_points
        self._restore_inner_model()
        with torch.no_grad(), poutine.block(), default_dtype(ref.dtype):
            self.inner(*args, **kwargs)
        if isinstance(self.inner, torch.nn.Module):
            self.inner.to(device=ref.device, dtype=ref.dtype)
        self._inner_ready = True

    @property
    def is_set_up(self) -> bool:
        return self._set_up and self._inner_ready

    def _ensure_set_up(self) -> None:
        super()._ensure_set_up()
        if not self._inner_ready:
            with torch.random.fork_rng(devices=[]):
                self._prepare_inner(*example_args(self.model))

    def layer_gaussian(self, site: LayerSite) -> LayerGaussian:
        self._ensure_set_up()
        found = autoguide_layer_gaussians(self.inner, [site.name])
        if site.name not in found:
            raise NotImplementedError(f"complete({type(self.inner).__name__}): q of "
                                      f"'{site.name}' is not a known Gaussian")
        return found[site.name]

    def _set_layer(self, site, loc, scale_tril):
        set_autoguide_gaussian(self.inner, site.name, loc, scale_tril)

    def _set_low_rank(self, site, q) -> bool:
        names = [s.name for s in self.layer_sites] if site is None else [site.name]
        with torch.no_grad():
            return set_autoguide_low_rank(self.inner, names, q)

    def _joint_q(self):
        joint = autoguide_joint_gaussian(self.inner, [s.name for s in self.layer_sites])
        return super()._joint_q() if joint is None else joint.distribution()

    def _set_joint(self, loc, scale_tril):
        if not set_autoguide_joint(self.inner, [s.name for s in self.layer_sites], loc,
                                   scale_tril):
            super()._set_joint(loc, scale_tril)

    def new_run(self, *args, **kwargs) -> GuideRun:
        """Draws the inner guide's sites for this run (its density sits on them)."""
        if not self._inner_ready:
            self._prepare_inner(*args, **kwargs)
        self._restore_inner_model()
        trace = poutine.trace(self.inner).get_trace(*args, **kwargs)
        values = {
            n: s["value"]
            for n, s in trace.nodes.items()
            if s["type"] == "sample" and not s["is_observed"]
        }
        missing = [s.name for s in self.layer_sites if s.name not in values]
        if missing:
            raise ValueError(
                f"complete(): the inner guide does not provide the inducing sites {missing}; "
                "build it on pyro_dgp.inducing_only(model)"
            )
        return GuideRun(supplied=values)

    def u_site(self, site, run):
        return run.supplied[site.name]


def complete(guide, model, name=None) -> Completed:
    """Turn a guide over the ``.u`` sites into a full guide of ``model``.

    :param guide: a Pyro autoguide class (or a ``functools.partial`` of one, with its
        options), built here on :func:`inducing_only` ``(model)``::

            guide = complete(AutoMultivariateNormal, model)
            guide = complete(partial(AutoLowRankMultivariateNormal, rank=5), model)

        or any Pyro guide (an instance) whose sites include every ``<layer>.u``, e.g. an
        autoguide built on ``inducing_only(model)`` with more than a class can say.
    """
    if _is_guide_class(guide):
        guide = guide(inducing_only(model))
    return Completed(guide, model, name=name)


#: name -> (the Pyro autoguide over the inducing outputs, its one-line description)
AUTOGUIDES = {
    "autonormal": (autoguide.AutoNormal, "Pyro AutoNormal over the inducing outputs, completed"),
    "automvn": (autoguide.AutoMultivariateNormal,
                "Pyro AutoMultivariateNormal over all inducing outputs, completed"),
    "autolowrank": (autoguide.AutoLowRankMultivariateNormal,
                    "Pyro AutoLowRankMultivariateNormal, completed"),
    "autoiaf": (autoguide.AutoIAFNormal, "Pyro AutoIAFNormal (normalising flow), completed"),
}


def _completed_autoguide(autoguide_class):
    return lambda model: complete(autoguide_class(inducing_only(model)), model)


for _name, (_autoguide, _description) in AUTOGUIDES.items():
    register_guide(_name, _description, build=_completed_autoguide(_autoguide))(Completed)


def _is_guide_class(guide) -> bool:
    """A class, or a ``functools.partial`` of one (not yet a guide: built on the model)."""
    while isinstance(guide, functools.partial):
        guide = guide.func
    return isinstance(guide, type)
