"""Per-point side files of UCI runs, and the stacked ensemble of runs built from them alone.

A run of ``uci.py --pointwise-dir DIR`` writes ``DIR/<run tag>.npz`` holding

``test_logp``  ``(N_test,)`` each test point's log predictive density (original units of y);
``loo_logp``   ``(N_train,)`` each training point's PSIS-LOO log predictive density (original
               units), from ``pyro_dgp.diagnostics.to_datatree`` and ``loo``;
``val_logp``   ``(N_val,)`` (runs of ``uci.py --validation``) each held-out training point's
               log predictive density (original units);
``loc, var``   ``(S, N_test)`` the predictive mixture's components in the model's (standardised)
               units: last-layer mean and variance of each draw, float32;
``noise``      ``(S, N_test)`` or ``()``: the Gaussian likelihood's variance (model units);
``weights``    ``(S, 1)`` or ``(S, N_test)`` the components' weights (absent: uniform);
``y_test, y_mean, y_std``  the test targets (original units) and the standardisation.

Stacking (Yao, Vehtari, Simpson and Gelman 2018; Yao, Vehtari and Gelman 2022 for fits that do
not mix) needs nothing else: the weights maximise ``sum_n log sum_k w_k p_k^loo(y_n)`` over the
training points (:func:`pyro_dgp.stacking.stacking_weights`), or the same sum of the held-out
densities ``val_logp`` where every run stacked has them, and the stacked test
log-density is exactly ``log sum_k w_k p_k(y_i)`` (:func:`stacked_log_density`). Its CRPS and
coverage are those of the mixture of every run's components weighted ``w_k`` times the run's
own component weights.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from pyro_dgp.diagnostics import loo, to_datatree
from pyro_dgp.likelihoods import Gaussian
from pyro_dgp.prediction import MixturePredictive
from pyro_dgp.prediction.metrics import coverage, crps, rmse
from pyro_dgp.stacking import stacking_weights

__all__ = ["diagnostics", "held_out_elpd", "held_out_log_density", "loo_log_density",
           "save_run", "load_run", "stack_records", "stack_runs", "stacked_log_density"]

LOO_DRAWS = 100
"""Guide draws of each run's PSIS-LOO (at least ``pyro_dgp.diagnostics.psis.MIN_PSIS_DRAWS``)."""


def _noise(pred) -> torch.Tensor:
    """The likelihood's variance per draw (model units): as the predictive recorded it, else
    the likelihood's point value."""
    values = pred.hyperparameters or pred.likelihood.hyperparameters()
    return torch.as_tensor(values["variance"]).detach().to(pred.loc)


def diagnostics(pred, y: torch.Tensor) -> dict:
    """Figures that explain a fit's NLL and RMSE, in original units of ``y``: the learned
    noise variance (mean over draws), the mean predictive variance and its split into the
    spread of the components' means (epistemic) and their own variances, and the bias of the
    mixture mean.

    :param pred: a Gaussian-likelihood :class:`~pyro_dgp.prediction.MixturePredictive` already
        rescaled to original units; :param y: ``(N,)`` test targets, original units.
    """
    scale = pred.y_std ** 2
    with torch.no_grad():
        mean, variance = pred.mean, pred.variance
        w = pred.weights if pred.weights is not None else pred.loc.new_full(
            (pred.num_samples, 1), 1.0 / pred.num_samples)
        loc_mean = (w * pred.loc).sum(0)
        spread = (w * (pred.loc - loc_mean).square()).sum(0) * scale  # (N,) between draws
    return {"noise_variance": float(_noise(pred).mean()) * scale,
            "predictive_variance_mean": float(variance.mean()),
            "draw_spread_variance_mean": float(spread.mean()),
            "mean_bias": float((mean - y).mean()),
            "abs_error_mean": float((mean - y).abs().mean())}


def loo_log_density(model, guide, X: torch.Tensor, y: torch.Tensor, y_std: float,
                    seed: int) -> np.ndarray:
    """``(N,)`` each training point's PSIS-LOO log predictive density in original units
    (``y`` standardised; the density of ``y_std * y`` is divided by ``y_std``)."""
    import warnings

    dt = to_datatree(model, guide, X, y, num_samples=LOO_DRAWS, seed=seed, kl=False)
    with warnings.catch_warnings():  # Pareto k is a property of each fit, not of stacking
        warnings.filterwarnings("ignore", "Estimated shape parameter of Pareto", UserWarning)
        elpd = loo(dt, pointwise=True)
    return np.asarray(elpd.elpd_i.values, dtype=np.float64).reshape(-1) - math.log(y_std)


def held_out_log_density(pred, y: torch.Tensor) -> np.ndarray:
    """``(N,)`` log predictive densities of held-out targets ``y`` (original units) under a
    predictive ``pred`` already rescaled to original units."""
    return pred.log_prob(y).detach().cpu().double().numpy()


def save_run(path: Path, pred, y_test: torch.Tensor, loo_logp: np.ndarray,
             val_logp: np.ndarray | None = None) -> None:
    """Write one run's side file (module docstring) atomically. ``pred``: its predictive in
    original units; ``y_test``: ``(N_test,)`` original units; ``val_logp``: the held-out
    points' log densities, where the run held some out."""
    arrays = {"test_logp": pred.log_prob(y_test).detach().cpu().double().numpy(),
              "loo_logp": np.asarray(loo_logp, dtype=np.float64),
              "loc": pred.loc.detach().cpu().float().numpy(),
              "var": pred.var.detach().cpu().float().numpy(),
              "noise": _noise(pred).cpu().float().numpy(),
              "y_test": y_test.detach().cpu().double().numpy(),
              "y_mean": np.float64(pred.y_mean), "y_std": np.float64(pred.y_std)}
    if pred.weights is not None:
        arrays["weights"] = pred.weights.detach().cpu().double().numpy()
    if val_logp is not None:
        arrays["val_logp"] = np.asarray(val_logp, dtype=np.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    with os.fdopen(fd, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    os.replace(tmp, path)


def load_run(path: Path) -> dict[str, np.ndarray]:
    """One side file's arrays by name."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def stacked_log_density(log_densities, weights) -> np.ndarray:
    """``(N,)`` ``log sum_k w_k p_k(y_n)`` from ``(N, K)`` log densities and ``(K,)`` weights
    on the simplex (a zero weight drops its candidate)."""
    lp = np.asarray(log_densities, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if lp.ndim != 2 or w.shape != (lp.shape[1],):
        raise ValueError(f"log_densities must be (N, K) and weights (K,), got {lp.shape} and "
                         f"{w.shape}")
    with np.errstate(divide="ignore"):
        log_w = np.log(w)
    top = (lp + log_w).max(1, keepdims=True)
    return (top + np.log(np.exp(lp + log_w - top).sum(1, keepdims=True)))[:, 0]


def _stacked_predictive(runs: list[dict], weights: np.ndarray) -> MixturePredictive:
    """Every run's components as one mixture, run ``k``'s weighted ``w_k`` times its own."""
    parts = {"loc": [], "var": [], "noise": [], "w": []}
    n = runs[0]["loc"].shape[1]
    for run, w_k in zip(runs, weights, strict=True):
        S = run["loc"].shape[0]
        own = run.get("weights", np.full((S, 1), 1.0 / S))
        parts["loc"].append(run["loc"])
        parts["var"].append(run["var"])
        parts["noise"].append(np.broadcast_to(run["noise"], (S, n)))
        parts["w"].append(w_k * np.broadcast_to(own, (S, n)))
    cat = {k: torch.as_tensor(np.concatenate(v), dtype=torch.float64) for k, v in parts.items()}
    return MixturePredictive(cat["loc"], cat["var"], Gaussian(), float(runs[0]["y_mean"]),
                             float(runs[0]["y_std"]), hyperparameters={"variance": cat["noise"]},
                             weights=cat["w"] / cat["w"].sum(0))


def stack_runs(paths: list[Path]) -> dict:
    """Stack the runs of these side files (one split, one test set): ``weights`` (from their
    held-out densities where every run has them, else their training points' PSIS-LOO
    densities; ``weights_from`` names which), the stacked test log-likelihood (mean over
    points, exact), and the RMSE, CRPS and 95% coverage of the stacked mixture of their
    components."""
    runs = [load_run(p) for p in paths]
    key = "val_logp" if all("val_logp" in r for r in runs) else "loo_logp"
    if len({r["y_test"].shape for r in runs}) > 1 or len({r[key].shape for r in runs}) > 1:
        raise ValueError("stack_runs: the runs have different test or training sets; stack "
                         "runs of one split")
    weights = stacking_weights(np.stack([r[key] for r in runs], 1)).numpy()
    test = stacked_log_density(np.stack([r["test_logp"] for r in runs], 1), weights)
    pred = _stacked_predictive(runs, weights)
    y = torch.as_tensor(runs[0]["y_test"], dtype=torch.float64)
    return {"weights": weights.tolist(), "weights_from": key, "test_loglik": float(test.mean()),
            "rmse": rmse(pred, y), "crps": crps(pred, y), "coverage95": coverage(pred, y, 0.95)}


def held_out_elpd(rec: dict | None, pointwise_dir) -> float:
    """Mean log density of a run record's held-out points (runs of ``uci.py --validation``),
    else of its training points' PSIS-LOO, from its side file in ``pointwise_dir`` (NaN: no
    run or no side file; -inf: not finite, a run whose LOO failed)."""
    name = (rec or {}).get("diagnostics", {}).get("pointwise")
    path = Path(pointwise_dir) / name if name else None
    if path is None or not path.exists():
        return math.nan
    run = load_run(path)
    value = float(np.mean(run["val_logp"] if "val_logp" in run else run["loo_logp"]))
    return value if math.isfinite(value) else -math.inf


def stack_records(recs: dict[str, dict], pointwise_dir) -> dict | None:
    """:func:`stack_runs` of these run records (label -> record) over those with a finite
    :func:`held_out_elpd`, with ``weights`` by label and ``seconds`` the members' sum
    (``None``: fewer than two such runs)."""
    usable = {label: rec for label, rec in recs.items()
              if math.isfinite(held_out_elpd(rec, pointwise_dir))}
    if len(usable) < 2:
        return None
    paths = [Path(pointwise_dir) / r["diagnostics"]["pointwise"] for r in usable.values()]
    stacked = stack_runs(paths)
    weights = dict(zip(usable, stacked.pop("weights"), strict=True))
    return {**stacked, "seconds": sum(r["seconds"] for r in usable.values()),
            "weights": weights}
