"""Minibatches: the check that a model scales its likelihood by ``N / B``.

An unbiased minibatch ELBO needs every observation of a batch of ``B`` of the ``N`` points
weighted ``N / B``. In Pyro the data plate does it when it knows both sizes::

    def model(X, y=None):                        # X: a batch of B rows
        ...
        with pyro.plate("data", size=N, subsample=torch.arange(len(X))):
            pyro.sample("y", dist.Normal(f, noise), obs=y)

(``pyro.plate("data", len(X))`` scales by 1: the ELBO then weighs the data ``B / N`` times
too little against the KL.) A :class:`~pyro_dgp.DeepGP` does this with its ``num_data``, which
:func:`~pyro_dgp.fit` sets to ``N``.
"""

from __future__ import annotations

import math
import warnings

import torch

from ..guides.draws import observation_sites, trace_draws_and_model
from ..rng import seeded

__all__ = ["FULL_SIZE_PLATE", "MinibatchScaleWarning", "check_minibatch_scale",
           "misscaled_observations"]


class MinibatchScaleWarning(UserWarning):
    """A model's observations are not scaled ``N / B`` on a minibatch."""


def misscaled_observations(model, guide, X: torch.Tensor, y: torch.Tensor,
                           num_data: int) -> list[str]:
    """The observed sites of ``model`` run on the batch ``X (B, D)``, ``y (B,)`` whose scale is
    not ``num_data / B`` (module docstring), each described with its scale and plates.

    One traced run of guide and model, on its own seeded random stream (the global one is
    left as it was) and without gradients."""
    B = X.shape[-2]
    expected = num_data / B
    with torch.no_grad(), seeded(0, X.device):
        guide_trace, model_trace = trace_draws_and_model(model, guide, (X, y), 1)
    found = []
    for name, site in observation_sites(model_trace, guide_trace):
        if not site["is_observed"]:
            continue
        scale = site["scale"]
        scale = float(scale.max()) if isinstance(scale, torch.Tensor) else float(scale)
        if math.isclose(scale, expected, rel_tol=1e-6):
            continue
        plates = [f"{f.name}(size={f.size}, full_size={getattr(f, 'full_size', f.size)})"
                  for f in site["cond_indep_stack"]]
        found.append(f"the model scales its observation site '{name}' by {scale:.4g}, not "
                     f"N / B = {expected:.4g} (its plates: {', '.join(plates) or 'none'}): the "
                     f"data then count {expected / scale:.3g} times too little against the KL")
    return found


#: how a model scales its observations by N / B
FULL_SIZE_PLATE = ("give the data plate the full size, pyro.plate('data', size=N, "
                   "subsample=torch.arange(len(X))) (see pyro_dgp.infer.minibatch)")


def check_minibatch_scale(model, guide, X: torch.Tensor, y: torch.Tensor, num_data: int) -> None:
    """Warn (:class:`MinibatchScaleWarning`) for each observed site of ``model`` run on the
    batch ``X (B, D)``, ``y (B,)`` whose scale is not ``num_data / B``
    (:func:`misscaled_observations`)."""
    B = X.shape[-2]
    for problem in misscaled_observations(model, guide, X, y, num_data):
        warnings.warn(f"fit passes minibatches of {B} of {num_data} points, but {problem}. "
                      f"{FULL_SIZE_PLATE[0].upper()}{FULL_SIZE_PLATE[1:]}, or pass "
                      "batch_size=None", MinibatchScaleWarning, stacklevel=3)
