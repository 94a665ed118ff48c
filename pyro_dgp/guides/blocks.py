"""Gaussian blocks of a guide's ``q(u)``: read, substituted for one evaluation, written back.

A family whose ``q(u)`` is a product of full Gaussians (``MeanField``: one per layer and
output; full-rank ``Coupled``: one over all layers) names its blocks and exposes each as
``(loc (..., n), scale_tril (..., n, n))``. Within :meth:`GaussianBlocks.substituted` the
family computes with the given tensors instead of its parameters, so a loss evaluated there
is differentiable in them: what natural-gradient steps need (:mod:`pyro_dgp.infer.natgrad`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..state import swapped

__all__ = ["GaussianBlocks"]


class GaussianBlocks:
    """Mixin of the layer guides whose ``q(u)`` is a product of full Gaussian blocks."""

    _substituted_blocks: dict | None = None

    def gaussian_blocks(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{name: (loc (..., n), scale_tril (..., n, n))}``, detached, of every block."""
        raise NotImplementedError

    def set_gaussian_blocks(self, blocks: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write ``{name: (loc, scale_tril)}`` (some or all blocks) into the family's
        parameters."""
        raise NotImplementedError

    def natural_gradient_blocks(self) -> GaussianBlocks:
        """The guide itself (the guide protocol's question, answered for these families)."""
        return self

    def last_block(self) -> str:
        """The name of the block that holds the last layer's ``q(u)``."""
        raise NotImplementedError

    @contextlib.contextmanager
    def substituted(self, blocks: dict[str, tuple[torch.Tensor, torch.Tensor]]
                    ) -> Iterator[GaussianBlocks]:
        """Within the block the family reads ``q(u)`` of the blocks in ``blocks`` (some or all,
        as :meth:`gaussian_blocks` names them) from there instead of its parameters."""
        unknown = set(blocks) - set(self.gaussian_blocks())
        if unknown:
            raise ValueError(f"{type(self).__name__}: no Gaussian blocks {sorted(unknown)}; it "
                             f"has {sorted(self.gaussian_blocks())}")
        with swapped(self, "_substituted_blocks", dict(blocks)):
            yield self

    def substituted_block(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The block ``name`` in effect within :meth:`substituted`, else ``None``."""
        blocks = self._substituted_blocks
        return None if blocks is None else blocks.get(name)
