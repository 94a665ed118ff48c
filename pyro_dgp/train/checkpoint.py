"""Checkpoints of a run: random streams, atomic writes, weights-only reads (saved fits of a
model with its guide are in :mod:`pyro_dgp.train.saved`)."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pyro
import torch

__all__ = ["CHECKPOINT_KEYS", "atomic_save", "read_checkpoint", "rng_state", "safe_load",
           "set_rng_state"]

#: the parts of a training checkpoint (what ``fit(checkpoint=...)`` writes and resumes from)
CHECKPOINT_KEYS = ("step", "model", "guide", "optimizer", "rng", "losses")


def rng_state(generator: torch.Generator, device: torch.device) -> dict:
    """Every random stream a step draws from: Pyro's (torch CPU, Python, NumPy), the
    minibatch generator's and, for data on a GPU, that GPU's (the guides draw there)."""
    pyro_state = pyro.util.get_rng_state()
    # NumPy's state holds an array: stored as a tensor, so the file loads with weights_only
    name, keys, pos, has_gauss, cached = pyro_state["numpy"]
    pyro_state["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    state = {"pyro": pyro_state, "batches": generator.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, generator: torch.Generator, device: torch.device) -> None:
    # generator states must be CPU byte tensors, whatever map_location moved them to
    name, keys, pos, has_gauss, cached = state["pyro"]["numpy"]
    numpy_state = (name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached)
    pyro_state = dict(state["pyro"], torch=state["pyro"]["torch"].cpu(), numpy=numpy_state)
    pyro.util.set_rng_state(pyro_state)
    generator.set_state(state["batches"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def atomic_save(path: Path, payload: dict) -> None:
    """``torch.save`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written checkpoint


def safe_load(path: str | os.PathLike, map_location=None) -> dict:
    """``torch.load`` of a checkpoint or saved fit with ``weights_only=True``: tensors, numbers,
    strings and plain containers only, so a file from someone else cannot run code.

    :raises FileNotFoundError: when there is no file at ``path``.
    :raises ValueError: naming the file, as unsafe when it holds objects the loader refuses
        (nothing in it runs, and the message gives no way to load it anyway), when it cannot
        be read as a torch file at all (corrupt, truncated, or some other kind of file), or
        when it holds something other than a dict.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        reason = _loader_reason(err)
        if _REFUSAL.search(reason):
            raise ValueError(
                f"refusing to load {os.fspath(path)!r}: the file is unsafe: it holds objects "
                "other than tensors and plain data (a reference to a function or class that "
                "loading would call), which could run code; checkpoints and fits written by "
                f"pyro_dgp hold none. Loader's reason: {reason}") from None
        raise _unreadable(path, reason) from None
    except OSError as err:
        if err.filename is None:  # raised while reading the archive, not while opening it
            raise _unreadable(path, _loader_reason(err)) from None
        raise ValueError(f"cannot read {os.fspath(path)!r}: {err.strerror}") from None
    except Exception as err:  # noqa: BLE001 (a damaged file fails anywhere in the reader)
        raise _unreadable(path, _loader_reason(err)) from None
    if not isinstance(state, dict):
        raise ValueError(f"{os.fspath(path)!r} holds a {type(state).__name__}, not a checkpoint "
                         "or a saved fit (a dict written by pyro_dgp)")
    return state


#: what the weights-only unpickler says when it refuses an object it could build but will not
#: (a global outside its allow-list), as opposed to bytes that are no pickle it understands
_REFUSAL = re.compile(r"\bglobal\b|allowlist|must be imported", re.IGNORECASE)


def _loader_reason(err: Exception) -> str:
    """The loader's own reason, one line, without torch's advice around it (which would
    suggest loading the file unsafely): the unpickler's error that torch wrapped where there
    is one, else the text after ``WeightsUnpickler error:``, else the message's first line
    that is not that advice."""
    inner = err.__cause__ or err.__context__
    if isinstance(inner, pickle.UnpicklingError) and str(inner).strip():
        text = str(inner)
    else:
        text = str(err)
        _, found, tail = text.partition("WeightsUnpickler error:")
        text = tail if found else text
    lines = [line.split(" Please use ")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not _ADVICE.search(line)]
    reason = lines[0] if lines else ""
    return f"{type(err).__name__}: {reason}" if reason else type(err).__name__


#: torch's advice around a weights-only refusal: how to load the file anyway
_ADVICE = re.compile(r"weights.only|trusted source|trust the source|add_safe_globals|"
                     r"documentation of torch\.load", re.IGNORECASE)


def _unreadable(path: Path, reason: str) -> ValueError:
    return ValueError(f"cannot read {os.fspath(path)!r} (corrupt or not a checkpoint): the "
                      f"file is no torch.save file pyro_dgp can load ({reason})")


def read_checkpoint(path: str | os.PathLike, map_location=None) -> dict:
    """A training checkpoint written by :func:`~pyro_dgp.fit` (``checkpoint=path``), loaded
    with :func:`safe_load`; a ``ValueError`` naming the file when it is a saved fit or lacks
    what resuming needs."""
    state = safe_load(path, map_location=map_location)
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing and "config" in state:
        raise ValueError(f"{os.fspath(path)!r} is a fit saved by save_fit / `pyro-dgp fit`, not "
                         "a training checkpoint: training resumes from the checkpoint file "
                         "fit writes (`checkpoint=`; the CLI's OUTPUT/checkpoint.pt)")
    if missing:
        raise ValueError(f"{os.fspath(path)!r} is not a training checkpoint of pyro_dgp: it "
                         f"lacks {missing}")
    return state

