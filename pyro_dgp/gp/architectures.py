"""Deep GP architectures of Salimbeni and Deisenroth 2017: the DSVI layer stack (k-means
inducing inputs, identity/PCA means of the inner layers, ARD kernels with between-layer white
noise), its starting values, and the checks of the builders' arguments."""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings

import numpy as np
import torch
from scipy.cluster.vq import kmeans2

from .. import kernels as K
from ..deprecation import user_stacklevel
from ..likelihoods import BernoulliProbit, Gaussian, Likelihood, StudentT
from ..state import global_setting
from ..validation import (
    check_bool,
    check_inputs,
    check_positive_finite,
    check_positive_int,
    check_targets,
    labels_like,
)
from .layer import GPLayer

__all__ = ["DEFAULT_NUM_INDUCING", "KERNELS", "LIKELIHOODS", "LN2", "SMALL_INPUT_STD",
           "check_regression_arguments", "default_dtype", "dsvi_layers", "kmeans",
           "make_likelihood", "pca_mean"]


#: ``ln 2 = softplus(0)``: the starting noise variance, kernel variances and lengthscales of
#: ``DeepGP.regression`` (chosen by the initialisation study in ``BENCHMARKS.md``).
LN2 = math.log(2.0)

KERNELS = {
    "rbf": K.RBF,
    "matern12": K.Matern12,
    "matern32": K.Matern32,
    "matern52": K.Matern52,
}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules directly in the data's dtype (a float32 build cast to float64 would keep
    float32 rounding in its initial values)."""
    with global_setting(torch.get_default_dtype, torch.set_default_dtype, dtype):
        yield


def kmeans(X: torch.Tensor, M: int, seed: int) -> torch.Tensor:
    """``(M, D)`` distinct k-means centres of ``X (N, D)`` (scipy's k-means++), on X's device
    and dtype.

    With ``M = N`` distinct rows, ``X`` itself. With at most ``M`` distinct rows (duplicated
    inputs), those rows (the k-means optimum, every cluster a point), and the remaining
    centres drawn around them (:func:`_fill_distinct`): identical inducing inputs would make
    ``K_uu`` singular and duplicate each other's work."""
    Xn = X.detach().cpu().double().numpy()
    distinct = np.unique(Xn, axis=0)
    if len(distinct) == M == X.shape[0]:
        return X.clone()
    if len(distinct) <= M:
        centres = distinct
    else:
        with warnings.catch_warnings():
            # an empty cluster keeps its last centre, a usable inducing input; a centre that
            # coincides with another is replaced by _fill_distinct
            warnings.filterwarnings("ignore", "One of the clusters is empty", UserWarning)
            centres, _ = kmeans2(Xn, M, minit="++", seed=np.random.default_rng(seed))
    return torch.as_tensor(_fill_distinct(centres, M, Xn, seed, X.dtype), device=X.device)


def _first_distinct(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of ``rows (n, D)``, each at its first occurrence, in order."""
    _, first = np.unique(rows, axis=0, return_index=True)
    return rows[np.sort(first)]


def _fill_distinct(centres: np.ndarray, M: int, Xn: np.ndarray, seed: int,
                   dtype: torch.dtype) -> np.ndarray:
    """``(M, D)`` distinct rows in ``dtype`` (as NumPy): the distinct rows of ``centres``
    first, then, where there are fewer than ``M``, points drawn (from ``seed``) around them
    in turn: ``c + 0.01 sd * e``, ``e ~ N(0, I)``, ``sd`` the per-column standard deviation
    of the data ``Xn (N, D)`` (``max(1, |x|)`` on a constant column), so they stay within
    the data's spread; a draw that rounds onto an existing row is drawn again, wider."""
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    out = _first_distinct(centres.astype(np_dtype))
    rng = np.random.default_rng(seed)
    spread = Xn.std(0)
    scale = 1e-2 * np.where(spread > 0, spread, np.maximum(np.abs(Xn).max(0), 1.0))
    while out.shape[0] < M:
        base = out[np.arange(M - out.shape[0]) % out.shape[0]].astype(np.float64)
        drawn = base + scale * rng.standard_normal(base.shape)
        out = _first_distinct(np.concatenate([out, drawn.astype(np_dtype)]))
        scale = 2 * scale
    return out


def pca_mean(X: torch.Tensor, d_out: int) -> torch.Tensor:
    """DSVI's fixed inner-layer mean ``x W``, ``W`` of shape ``(D_in, d_out)`` for ``X`` of
    shape ``(N, D_in)``: identity, PCA projection, or identity padded.

    The PCA projection has at most ``N`` directions: with fewer points than hidden dims
    (``N < d_out < D_in``) its last ``d_out - N`` columns are zeros (those hidden dims start
    with a zero mean and are left to their GPs)."""
    d_in = X.shape[-1]
    if d_in == d_out:
        return torch.eye(d_in, dtype=X.dtype, device=X.device)
    if d_in > d_out:
        # top principal directions of the (centred) layer inputs
        _, _, Vh = torch.linalg.svd(X - X.mean(0), full_matrices=False)
        W = Vh[:d_out].mT
        if W.shape[1] < d_out:  # fewer points than hidden dims: zero columns
            W = torch.cat([W, W.new_zeros(d_in, d_out - W.shape[1])], dim=1)
        return W.contiguous()
    return torch.cat([torch.eye(d_in, dtype=X.dtype, device=X.device),
                      X.new_zeros(d_in, d_out - d_in)], dim=1)


#: a column of ``X`` with a standard deviation below this is warned about: with the starting
#: lengthscale ``ln 2`` two points one such deviation apart have a kernel correlation above
#: ``exp(-0.1^2 / (2 ln^2 2)) = 0.99``, so the initial GP is nearly constant along the column
#: and the fit must first shrink the lengthscale by an order of magnitude or more. A fit of
#: ``sin(2x)`` can fail at a column deviation above ``1e-2`` (``benchmarks/results/history.md``,
#: "Small input columns"), so a threshold of ``1e-2`` would miss such failures; ``0.1`` leaves a
#: margin.
SMALL_INPUT_STD = 0.1


def _column_messages(X: torch.Tensor) -> list[str]:
    """Messages on ``X (N, D)``'s columns off the standardised scale (``N >= 2``). A constant
    column is harmless (a stationary kernel and a linear mean ignore it; a standardised
    split can hold one, as naval's do): it is not named."""
    mean, std = X.mean(0), X.std(0)
    m, s = float(mean.abs().max()), float(std.max())
    msgs = []
    if m > 100 or s > 100:
        msgs.append(f"X has columns with |mean| up to {m:.3g} and standard deviation up to "
                    f"{s:.3g}")
    small = ((std > 0) & (std < SMALL_INPUT_STD)).nonzero().flatten().tolist()
    if small:
        listed = small[:10] + (["..."] if len(small) > 10 else [])
        msgs.append(f"X's column(s) {listed} have a standard deviation below "
                    f"{SMALL_INPUT_STD} (down to {float(std[small].min()):.3g}), on which the "
                    "starting lengthscales see a nearly constant function")
    return msgs


def _warn_unstandardised(X: torch.Tensor, y: torch.Tensor | None) -> None:
    """Warn where ``regression``'s defaults, which assume standardised data, do not fit it.

    The initial noise variance, kernel variances and lengthscales (``ln 2``) and the last
    layer's zero mean are on the scale of standardised targets and inputs: on raw targets in
    the thousands the noise must grow by orders of magnitude before the predictive variance
    means anything (a review found badly miscalibrated intervals after thousands of steps,
    silently), inputs far from the origin cost float32 digits in every kernel matrix, and
    along inputs of a small spread (:data:`SMALL_INPUT_STD`) the starting GP is constant."""
    with torch.no_grad():
        msgs = []
        if y is not None and y.numel() > 1:
            m, s = float(y.mean()), float(y.std())
            if not (0.1 <= s <= 10 and abs(m) <= 3 * s):
                msgs.append(f"y has mean {m:.3g} and standard deviation {s:.3g}")
        if X.shape[0] > 1:
            msgs += _column_messages(X)
    if msgs:
        warnings.warn(
            "DeepGP.regression's initial noise variance, kernel variances and lengthscales "
            f"assume standardised data, but {' and '.join(msgs)}: standardise them "
            "(pyro_dgp.datasets.load and pyro_dgp.datasets.load_csv do; keep the statistics "
            "to report in original units), or pass noise_variance, kernel_variance and "
            "lengthscale on the data's scale",
            UserWarning, stacklevel=user_stacklevel())


#: ``num_inducing`` of the builders when not given: ``min(DEFAULT_NUM_INDUCING, N)`` (every
#: training point an inducing input when ``N <= 100``)
DEFAULT_NUM_INDUCING = 100


def check_regression_arguments(X, y, num_layers, hidden_dim, num_inducing, kernel, likelihood,
                               noise_variance, seed, flags: dict | None = None) -> dict:
    """Validate :meth:`~pyro_dgp.DeepGP.regression`'s arguments (warning on unstandardised
    data); returns ``{"num_layers", "hidden", "M", "seed", "noise_variance"}`` checked, and
    the boolean options ``flags`` (name to value) each checked to be a bool under its name.

    ``num_inducing=None``: ``min(100, N)``. Integer or boolean labels of a binary likelihood
    are read in ``X``'s dtype."""
    check_inputs(X)
    if X.dim() != 2:
        raise ValueError(f"X must be 2-D (N, D), got shape {tuple(X.shape)}")
    N, D = X.shape
    binary = likelihood == "probit" or isinstance(likelihood, BernoulliProbit)
    if binary:
        y = labels_like(y, X)
    check_targets(y, N, binary=binary)
    if y.dim() != 1:
        raise ValueError(f"y must be 1-D of shape (N,), got shape {tuple(y.shape)}")
    checked = {name: check_bool(value, f"DeepGP.regression: {name}")
               for name, value in (flags or {}).items()}
    num_layers = check_positive_int(num_layers, "num_layers")
    M = (min(DEFAULT_NUM_INDUCING, N) if num_inducing is None
         else check_positive_int(num_inducing, "num_inducing", upper=N))
    hidden = check_positive_int(hidden_dim if hidden_dim is not None else min(30, D),
                                "hidden_dim")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if seed is not None:
        seed = check_positive_int(seed, "DeepGP.regression: seed", allow_zero=True)
    if isinstance(likelihood, str) and likelihood in ("gaussian", "studentt"):
        noise_variance = check_positive_finite(noise_variance,
                                               "DeepGP.regression: noise_variance")
    _warn_unstandardised(X, None if binary else y)
    if isinstance(likelihood, str) and likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {sorted(LIKELIHOODS)}, got {likelihood!r}")
    if not isinstance(likelihood, str | Likelihood):
        raise TypeError(
            f"DeepGP.regression: likelihood must be one of {sorted(LIKELIHOODS)} or a "
            f"pyro_dgp.likelihoods.Likelihood, got {type(likelihood).__name__}"
        )
    return {**checked, "num_layers": num_layers, "hidden": hidden, "M": M, "seed": seed,
            "noise_variance": noise_variance}


#: likelihoods of the builders by name, made from the initial noise variance
LIKELIHOODS = {
    "gaussian": lambda noise_variance: Gaussian(noise_variance),
    "studentt": lambda noise_variance: StudentT(scale=noise_variance**0.5),
    "probit": lambda noise_variance: BernoulliProbit(),
}


def make_likelihood(likelihood: str | Likelihood, noise_variance: float) -> Likelihood:
    """A likelihood by name (:data:`LIKELIHOODS`), or ``likelihood`` itself."""
    if isinstance(likelihood, str):
        return LIKELIHOODS[likelihood](noise_variance)
    return likelihood


def dsvi_layers(X, num_layers, hidden, M, kernel, whiten, inner_noise, kernel_variance,
                lengthscale, jitter, seed, inducing_scheme, ard=True,
                train_mean=False, kernel_per_output=False) -> list[GPLayer]:
    """The layers of a DSVI deep GP for inputs ``X (N, D)`` (Salimbeni and Deisenroth 2017):
    k-means inducing inputs, propagated through the fixed linear (identity/PCA) means of the
    inner layers; ARD kernels with variance ``kernel_variance`` and lengthscales
    ``lengthscale``; between-layer noise ``inner_noise`` (a White kernel) on inner layers;
    zero mean on the last layer (``ard=False``: one lengthscale per kernel; ``train_mean``:
    the linear means learned from there; ``kernel_per_output``: each inner GP its own kernel
    hyperparameters). With ``inducing_scheme="propagated"`` (Ustyuzhaninov
    et al. 2020, §4.2) a layer whose ``u`` feeds the next layer's inducing inputs holds
    ``f(Z)``."""
    locations = inducing_scheme == "propagated"
    if locations and kernel_per_output:
        raise ValueError("kernel_per_output=True needs inducing_scheme='per-layer' (a kernel "
                         "per output is for layers with stored inducing inputs)")
    D = X.shape[-1]
    dims = [D] + [hidden] * (num_layers - 1) + [1]
    Z = kmeans(X, M, seed)
    H = X.detach()
    layers = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
        last = i == num_layers - 1
        outputs = d_out if kernel_per_output and not last else None
        base = KERNELS[kernel](d_in, variance=kernel_variance, lengthscale=lengthscale, ard=ard,
                               outputs=outputs)
        kern = base if last else K.Sum(base, K.White(d_in, variance=inner_noise))
        mean = "zero" if last else pca_mean(H, d_out)
        # with locations, a layer whose u feeds the next layer's inducing inputs holds
        # f(Z) (unwhitened); the last layer is whitened (non-centred) if `whiten`
        values = locations and not (last and whiten)
        layers.append(
            GPLayer(d_in, d_out, inducing_points=Z, kernel=kern, mean=mean,
                    whiten=whiten and not values, jitter=jitter, name=f"layer{i + 1}",
                    function_values=values, train_mean=train_mean and not last,
                    # with locations, inner Z are random (the previous layer's f^z): the
                    # stored Z only sets the guides' initial means
                    train_inducing=not (locations and i > 0))
        )
        if not last:
            Z, H = Z @ mean, H @ mean
    return layers
