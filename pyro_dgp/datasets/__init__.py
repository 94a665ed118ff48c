"""Data sets: the UCI regression benchmarks, user CSV files and built-in synthetic problems.

Every loader returns a :class:`Split`, a train/test pair of tensors together with the
statistics used to standardise them, so that predictions can be reported in the original
units (the protocol of Salimbeni and Deisenroth 2017: standardise X and y on the training
part only, report test log-likelihood and RMSE in original units).

- :mod:`~pyro_dgp.datasets.splits`: the :class:`Split` container and its standardisation;
- :mod:`~pyro_dgp.datasets.uci`: the nine UCI regression sets with their standard splits,
  found in ``data_dir``, ``$PYRO_DGP_DATA`` or the user cache, or downloaded there
  (:func:`load`, :func:`num_splits`, :func:`download_uci`);
- :mod:`~pyro_dgp.datasets.csv`: :func:`load_csv`, a CSV file split at random;
- :mod:`~pyro_dgp.datasets.stream`: :class:`ArrayStream` (``.npy`` files, memory-mapped),
  :class:`DatasetStream`, :class:`IterableStream`: rows read on demand, standardised from one
  pass of running moments (:mod:`~pyro_dgp.datasets.moments`), for data that need not fit
  in memory;
- :mod:`~pyro_dgp.datasets.synthetic`: :func:`step`, :func:`compositional_toy`,
  :func:`two_mode_toy`, :func:`classification_2d` and :func:`heteroscedastic`, which need
  no files, are deterministic given ``seed`` and are not standardised. ``load(name)``
  accepts their names too, with ``split`` used as the seed.
"""

from .csv import load_csv
from .moments import Standardization
from .splits import Split
from .stream import ArrayStream, DatasetStream, IterableStream
from .synthetic import (
    SYNTHETIC,
    TWO_MODE_X,
    TWO_MODE_Y,
    classification_2d,
    compositional_inner,
    compositional_outer,
    compositional_toy,
    heteroscedastic,
    heteroscedastic_noise_std,
    step,
    two_mode_toy,
)
from .uci import (
    ENV_VAR,
    UCI_BASE_URL,
    UCI_DATASETS,
    UCI_NAMES,
    UCI_SHA256,
    ChecksumError,
    cache_dir,
    download_uci,
    env_data_dir,
    find_uci,
    load,
    num_splits,
    resolve_name,
    search_dirs,
)

__all__ = [
    "Split",
    "ArrayStream",
    "DatasetStream",
    "IterableStream",
    "Standardization",
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
    "env_data_dir",
    "find_uci",
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
