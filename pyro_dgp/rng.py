"""Seeded draws that leave the caller's random state untouched."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

__all__ = ["MAX_SEED", "seeded", "step_seed"]

#: the largest seed NumPy's global stream takes (``pyro.set_rng_seed`` seeds it too)
MAX_SEED = 2**32 - 1


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device):
    """Draw from ``seed`` inside the block (CPU and ``device``'s CUDA generator), restoring
    the global random state afterwards; ``seed=None`` draws from the global state as usual."""
    # torch.manual_seed seeds every GPU: fork (and restore) all that CUDA has set up
    devices = (list(range(torch.cuda.device_count()))
               if torch.device(device).type == "cuda" or torch.cuda.is_initialized() else [])
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of process ``rank``'s draws at ``step`` of a run seeded ``seed``: a hash of
    the three (NumPy's ``SeedSequence``), below ``2**32``."""
    return int(np.random.SeedSequence([seed % 2**63, step, rank]).generate_state(1)[0])
