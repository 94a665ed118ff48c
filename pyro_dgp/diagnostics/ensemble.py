"""Stacking of independently trained fits: one mixture of their posterior predictives, weighted
to score best on held-out points (Yao, Vehtari, Simpson and Gelman 2018; Yao, Vehtari and
Gelman 2022 for fits that sit in different modes and do not mix).

    p(y* | x*) = sum_j w_j p_j(y* | x*),    w = argmax_{simplex} sum_n log sum_j w_j p_j(y_n),

``p_j`` the predictive of fit ``j`` (its model and guide: :func:`~pyro_dgp.predict`), and
``log p_j(y_n)`` either at held-out validation points or, without them, each fit's PSIS-LOO
estimate at its training points (:func:`~pyro_dgp.diagnostics.loo`). Nothing is shared between
the fits: each keeps its own model (kernel, likelihood and inducing inputs, learned per fit)
and its own guide; only their predictives are mixed. ``fit(model, guide, X, y,
restarts=R).stack(X_val, y_val)`` stacks ``R`` restarts of one fit from ``R`` seeds.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..gp.layer import GPLayer
from ..guides.draws import check_guide_of
from ..prediction import MixturePredictive, predict
from ..stacking import stacking_weights
from ..validation import as_tensor_input, check_inputs, check_positive_int, check_targets
from .export import to_datatree
from .psis import MIN_PSIS_DRAWS, loo

__all__ = ["Stacked", "stack"]


@dataclass
class Stacked:
    """Fits combined by stacking (module docstring; made by :func:`stack`).

    :ivar fits: ``[(model, guide), ...]``, ``J`` of them, each with its own parameters.
    :ivar weights: ``(J,)`` the stacking weights, on the simplex.
    :ivar log_densities: ``(N, J)`` the pointwise log predictive densities they were fitted to.
    :ivar method: ``"validation"`` (held-out points) or ``"loo"`` (PSIS-LOO at the training
        points).
    """

    fits: list
    weights: torch.Tensor
    log_densities: torch.Tensor
    method: str

    def predict(self, X, num_samples: int = 100, chunk_rows: int = 1024, y_mean: float = 0.0,
                y_std: float = 1.0, seed: int | None = None) -> MixturePredictive:
        """The stacked predictive at ``X (N, D)``: each fit's :func:`~pyro_dgp.predict` of
        ``num_samples`` draws, fit ``j``'s draws weighted ``w_j / S`` (times its own weights
        where its predictive has them), in one :class:`~pyro_dgp.MixturePredictive`. Each
        draw keeps its fit's likelihood hyperparameters (e.g. its noise variance), so every
        closed form (``log_prob``, ``crps``, ``quantiles``) is that of the weighted mixture."""
        preds = [predict(model, guide, X, num_samples=num_samples, chunk_rows=chunk_rows,
                         seed=seed) for model, guide in self.fits]
        loc, var, hyper, weights = _concatenate(preds, self.weights)
        return MixturePredictive(loc, var, preds[0].likelihood, y_mean, y_std, hyper,
                                 mc_seed=0 if seed is None else seed, weights=weights)

    def __repr__(self) -> str:
        w = ", ".join(f"{float(v):.3f}" for v in self.weights)
        return f"Stacked({len(self.fits)} fits, method={self.method!r}, weights=[{w}])"


def stack(fits: Sequence, X_val=None, y_val=None, *, X=None, y=None, num_samples: int = 100,
          seed: int | None = 0) -> Stacked:
    """Combine independently trained fits into one stacked posterior predictive (module
    docstring): ``stack([guide_a, guide_b], X_val, y_val).predict(X_test)``.

    :param fits: the trained guides (each a guide of the library knows its model), or
        ``(model, guide)`` pairs, or what ``fit(..., restarts=R)`` returns; one family or
        several, each fit with its own model instance and hyperparameters. At least one; all
        of the same input dimension.
    :param X_val, y_val: ``(N, D)`` and ``(N,)`` held-out points: the weights maximise the
        stacked log predictive density there.
    :param X, y: instead of validation data, the training data of every fit: the weights then
        maximise the sum of each point's PSIS-LOO log predictive density (from
        ``to_datatree(model, guide, X, y, num_samples)`` of each fit; at least
        ``MIN_PSIS_DRAWS`` draws).
    :param num_samples: draws of each fit's predictive.
    :param seed: the draws' seed (the global random state is left untouched).
    :returns: :class:`Stacked` with ``.weights``, ``.predict(X)`` and the log densities.
    :raises ValueError: an empty ``fits``, fits of different input dimensions, data of another
        shape than the fits', or neither (or both) of the validation and training data.
    """
    pairs = _pairs(fits)
    S = check_positive_int(num_samples, "num_samples")
    dim = _input_dim(pairs)
    if (X_val is None) != (y_val is None):
        raise ValueError("stack: give both X_val and y_val (held-out points), or neither and "
                         "X, y (the training data) for PSIS-LOO")
    if X_val is not None and X is not None:
        raise ValueError("stack: give either validation data (X_val, y_val) or the training "
                         "data (X=, y=) for PSIS-LOO, not both")
    if X_val is None and (X is None or y is None):
        raise ValueError("stack needs held-out points (X_val, y_val) or the fits' training "
                         "data (X=, y=) for PSIS-LOO")
    device = _device(pairs[0][0])
    if X_val is not None:
        X_val, y_val = _data(X_val, y_val, dim, device, "X_val", "y_val")
        lpd = [predict(model, guide, X_val, num_samples=S, seed=seed).log_prob(y_val)
               for model, guide in pairs]
        method = "validation"
    else:
        X, y = _data(X, y, dim, device, "X", "y")
        _check_trained_on(pairs, X.shape[-2])
        lpd = [_loo_pointwise(model, guide, X, y, max(S, MIN_PSIS_DRAWS), seed)
               for model, guide in pairs]
        method = "loo"
    log_densities = torch.stack(lpd, dim=-1)
    return Stacked(pairs, stacking_weights(log_densities), log_densities, method)


def _pairs(fits) -> list[tuple]:
    """``fits`` as ``[(model, guide), ...]``, each guide checked against its model."""
    if isinstance(fits, torch.nn.Module) or not isinstance(fits, Sequence) or isinstance(
            fits, str):
        raise TypeError(f"stack: fits must be a list of trained guides or (model, guide) "
                        f"pairs, got {type(fits).__name__}")
    if not fits:
        raise ValueError("stack: fits is empty; give at least one trained guide")
    pairs = []
    for j, fit in enumerate(fits):
        if isinstance(fit, tuple | list) and len(fit) == 2:
            model, guide = fit
        elif getattr(fit, "guide", None) is not None:  # a record of a fit (Restart)
            model, guide = fit.model, fit.guide
        elif getattr(fit, "model", None) is not None:
            model, guide = fit.model, fit
        else:
            raise TypeError(f"stack: fits[{j}] is a {type(fit).__name__}, neither a guide of "
                            "the library (which knows its model) nor a (model, guide) pair")
        check_guide_of(model, guide, f"stack: fits[{j}]")
        pairs.append((model, guide))
    return pairs


def _input_dim(pairs: list[tuple]) -> int | None:
    """The input dimension the fits share (``None`` where no model tells it)."""
    dims = [_model_input_dim(model) for model, _ in pairs]
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise ValueError(f"stack: the fits' models take inputs of different dimensions "
                         f"{dims} (fits in order); stack fits of the same data")
    return known.pop() if known else None


def _model_input_dim(model) -> int | None:
    dim = getattr(model, "input_dim", None)
    if dim is not None or not isinstance(model, torch.nn.Module):
        return dim
    first = next((m for m in model.modules() if isinstance(m, GPLayer)), None)
    return None if first is None else first.input_dim


def _device(model):
    first = next(iter(model.parameters()), None) if isinstance(model, torch.nn.Module) else None
    return None if first is None else first.device


def _data(X, y, dim: int | None, device, x_name: str, y_name: str):
    X = as_tensor_input(X, device)
    check_inputs(X, dim, x_name)
    y = torch.as_tensor(y, device=X.device)
    check_targets(y, X.shape[-2], y_name)
    return X, y.to(X.dtype) if y.is_floating_point() else y


def _check_trained_on(pairs: list[tuple], n: int) -> None:
    """PSIS-LOO scores each fit at its own training points: refuse a fit whose model was
    trained on another number of points (``num_data``)."""
    for j, (model, _) in enumerate(pairs):
        num_data = getattr(model, "num_data", None)
        if num_data is not None and num_data != n:
            raise ValueError(f"stack: fits[{j}]'s model was trained on {num_data} points, "
                             f"X has {n}: PSIS-LOO needs each fit's own training data; give "
                             "held-out points (X_val, y_val) for fits of different data")


def _loo_pointwise(model, guide, X, y, num_samples: int, seed) -> torch.Tensor:
    """``(N,)`` each training point's PSIS-LOO log predictive density of one fit."""
    dt = to_datatree(model, guide, X, y, num_samples=num_samples, seed=seed, kl=False)
    with warnings.catch_warnings():  # k-hat is reported in the fits' own LOO, not here
        warnings.filterwarnings("ignore", "Estimated shape parameter of Pareto", UserWarning)
        elpd = loo(dt, pointwise=True)
    return torch.as_tensor(elpd.elpd_i.values.reshape(-1), dtype=X.dtype, device=X.device)


def _concatenate(preds: list, stack_weights: torch.Tensor):
    """``(loc, var, hyperparameters, weights)`` of the fits' predictives as one mixture over
    all their draws: each ``(S_total, N)``, the weights ``(S_total, 1)`` or ``(S_total, N)``."""
    if not all(isinstance(p, MixturePredictive) for p in preds):
        kinds = [type(p).__name__ for p in preds]
        raise ValueError(f"Stacked.predict: every fit's predictive must be a MixturePredictive "
                         f"(a model with a package likelihood), got {kinds}")
    kinds = {type(p.likelihood) for p in preds}
    names = {tuple(sorted(_hyperparameters(p))) for p in preds}
    if len(kinds) > 1 or len(names) > 1:
        raise ValueError(f"Stacked.predict: the fits' likelihoods differ "
                         f"({sorted(k.__name__ for k in kinds)}, hyperparameters "
                         f"{sorted(names)}); stack fits of one likelihood")
    N = preds[0].loc.shape[-1]
    per_point = any(p.weights is not None and p.weights.shape[-1] == N > 1 for p in preds)
    weights = []
    for w_j, p in zip(stack_weights, preds, strict=True):
        S = p.num_samples
        own = p.weights if p.weights is not None else p.loc.new_full((S, 1), 1.0 / S)
        weights.append(w_j.to(p.loc) * (own.expand(S, N) if per_point else own))
    values = [_hyperparameters(p) for p in preds]
    hyper = {k: torch.cat([v[k] for v in values]) for k in values[0]}
    return (torch.cat([p.loc for p in preds]), torch.cat([p.var for p in preds]), hyper,
            torch.cat(weights))


def _hyperparameters(pred: MixturePredictive) -> dict[str, torch.Tensor]:
    """``{name: (S, N)}`` the likelihood's values of each draw of one fit: as its predictive
    recorded them, else its likelihood's own (point) values, which in the stacked predictive
    must travel with the fit's draws."""
    if pred.hyperparameters:
        return {k: v.expand_as(pred.loc) for k, v in pred.hyperparameters.items()}
    with torch.no_grad():
        return {k: torch.as_tensor(v).detach().to(pred.loc).expand_as(pred.loc)
                for k, v in pred.likelihood.hyperparameters().items()}
