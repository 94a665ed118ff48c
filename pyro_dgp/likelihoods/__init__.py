"""Likelihoods ``p(y | f)`` of the last layer, with expectations under a Gaussian ``f``."""

from .base import BernoulliProbit, Gaussian, Likelihood, StudentT, gauss_hermite

__all__ = ["BernoulliProbit", "Gaussian", "Likelihood", "StudentT", "gauss_hermite"]
