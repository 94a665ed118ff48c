"""The guide families, one module each; importing them registers their names
(:func:`~pyro_dgp.guides.registry.register_guide`). A new family is one module here, imported
below, and its tests (``docs/write-a-guide.md``)."""

from . import amortized, chain, completed, coupled, meanfield, mixture, semi_implicit

__all__ = ["amortized", "chain", "completed", "coupled", "meanfield", "mixture",
           "semi_implicit"]
