"""Likelihoods ``p(y | f)`` of the last layer, with expectations under a Gaussian ``f``."""

from .base import AnalyticObservation, Likelihood, gauss_hermite, standard_normal_rule
from .gaussian import Gaussian
from .probit import BernoulliProbit
from .student_t import StudentT

__all__ = ["AnalyticObservation", "BernoulliProbit", "Gaussian", "Likelihood", "StudentT",
           "gauss_hermite", "standard_normal_rule"]
