"""The data options of the command line: which data a fit is of, saved with it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .. import datasets

__all__ = ["DEFAULT_TEST_FRACTION", "DTYPES", "check_device", "data_spec", "evaluate_settings",
           "is_csv", "load_data"]

DTYPES = {"float64": torch.float64, "float32": torch.float32}

# Keys of a saved fit's config that rebuild its data split (besides "model" and "guide"):
#   data           UCI/synthetic name, or the absolute path of a CSV file
#   target         CSV target column (None for named sets, whose target is fixed)
#   split          UCI: index of the standard split; synthetic set / CSV file: the split's seed
#   test_fraction  CSV: fraction of rows held out (None for named sets)
#   data_dir       absolute folder searched first for UCI files (None: $PYRO_DGP_DATA, cache)
#   dtype, device  of the data and model
#   seed           seed of model initialisation, training and prediction
#   samples        predictive samples S behind the reported metrics
DEFAULT_TEST_FRACTION = 0.1


def check_device(text: str) -> str:
    """``text`` if it names a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``,
    ``mps``, ``xpu``), else a ``ValueError`` saying why not."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"{text!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    backends = {"cpu": None, "cuda": torch.cuda, "mps": torch.backends.mps,
                "xpu": getattr(torch, "xpu", None)}
    if device.type not in backends:
        raise ValueError(f"{text!r}: a {device.type} device holds no data to fit on; use one of "
                         f"{sorted(backends)}")
    backend = backends[device.type]
    if backend is not None and not backend.is_available():
        why = (" (this torch is built without CUDA)"
               if device.type == "cuda" and torch.version.cuda is None else "")
        raise ValueError(f"{text!r}: no {device.type} device is available{why}")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ValueError(f"{text!r}: this machine has {count} CUDA device"
                             f"{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return text


def is_csv(data: str) -> bool:
    return str(data).lower().endswith(".csv")


def data_spec(data, target, split, test_fraction, data_dir, device, dtype, seed) -> dict:
    """Check the data arguments and fill in their defaults; the result is saved with a fit."""
    if is_csv(data):
        if not target:
            raise ValueError("--target is required with a CSV file (the target column's name)")
        if data_dir is not None:
            raise ValueError("--data-dir is only for UCI sets; give the CSV file's path in --data")
        if test_fraction is not None and not 0 < test_fraction < 1:
            raise ValueError(f"--test-fraction must lie in (0, 1) (the fit is scored on the "
                             f"held-out rows), got {test_fraction}")
        return {"data": str(Path(data).expanduser().resolve()), "target": target,
                "split": int(seed if split is None else split),
                "test_fraction": float(DEFAULT_TEST_FRACTION if test_fraction is None
                                       else test_fraction),
                "data_dir": None, "device": device, "dtype": dtype}
    if target is not None:
        raise ValueError(f"--target is only for CSV files: {data!r} is a named data set with a "
                         "fixed target column")
    if test_fraction is not None:
        raise ValueError(f"--test-fraction is only for CSV files: {data!r} has fixed train/test "
                         "splits (choose one with --split)")
    if data_dir is None:
        data_dir = os.environ.get(datasets.ENV_VAR) or None
    if data_dir is not None:
        data_dir = str(Path(data_dir).expanduser().resolve())
    return {"data": data, "target": None, "split": int(0 if split is None else split),
            "test_fraction": None, "data_dir": data_dir, "device": device, "dtype": dtype}


def load_data(spec: dict, classification: bool = False):
    if is_csv(spec["data"]):
        data = datasets.load_csv(spec["data"], target=spec["target"], seed=spec["split"],
                                 test_fraction=spec["test_fraction"], labels=classification)
    else:
        data = datasets.load(spec["data"], split=spec["split"], data_dir=spec["data_dir"])
    return data.to(device=spec["device"], dtype=DTYPES[spec["dtype"]])


def evaluate_settings(args, cfg: dict) -> tuple[dict, int, int]:
    """``(data spec, seed, samples)``: the fit's saved values, overridden by explicit ones."""
    seed = args.seed if args.seed is not None else cfg.get("seed", cfg["model"].get("seed", 0))
    samples = args.samples if args.samples is not None else cfg.get("samples", 100)
    data = args.data if args.data is not None else cfg.get("data")
    if data is None:
        raise ValueError("--data is required (the fit does not record its data set)")
    # The saved target / split / test fraction / data folder describe the saved data set; they
    # carry over unless --data names another kind of data (a CSV file instead of a named set,
    # or the other way round). Fits saved before these keys existed split a CSV file with
    # their seed (their "split" was unused), so their split is left to default to the seed.
    same_kind = cfg.get("data") is not None and is_csv(data) == is_csv(cfg["data"])
    saved = dict(cfg) if same_kind else {}
    if "test_fraction" not in cfg and is_csv(data):
        saved.pop("split", None)

    def pick(name, default=None):
        value = getattr(args, name)
        return value if value is not None else saved.get(name, default)

    device = args.device
    if device is None:  # the fit's device, which this machine may lack
        device = cfg.get("device", "cpu")
        try:
            check_device(device)
        except ValueError as err:
            raise ValueError(f"--device: the fit was saved with --device {device}, and {err}: "
                             "pass --device cpu (or another device this machine has) to "
                             "evaluate it here") from None
    spec = data_spec(data, pick("target"), pick("split"), pick("test_fraction"),
                      pick("data_dir"), device,
                      args.dtype if args.dtype is not None else cfg.get("dtype", "float64"),
                      seed)
    return spec, seed, samples
