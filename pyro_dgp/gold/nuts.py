"""``run_nuts``: the gold standard, Pyro's NUTS (Hoffman and Gelman 2014) on a small deep GP's
inducing outputs with the hyperparameters held fixed, and its posterior predictive.

The sampled density is ``q*(U) = p(U) exp(g(U)) / Z`` of :mod:`pyro_dgp.gold.target`, over
one value per site ``<layer>.u`` in the layer's own (whitened or unwhitened) coordinates, like
a guide's draws: NUTS runs on the potential ``-log p(U) - g(U)`` (no Pyro model is traced per
step; the priors and the first layer's map are computed once). Chains run one after another,
each from its own prior draw and its own seed ``seed + c``; NUTS does not cross between
well-separated modes, so several chains are what finds several modes. The chains' draws are
pooled with equal weight: where chains sit in different modes, a mode's weight in the pooled
draws is the fraction of chains in it, an estimate of its mass only as good as that count.

The predictive at test inputs follows a guide's (:func:`~pyro_dgp.predict`): per draw of
``U``, each inner layer's ``f`` is drawn per point from its conditional, and the last layer's
Gaussian ``N(loc, var)`` is kept, so the result is the same
:class:`~pyro_dgp.prediction.MixturePredictive`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from pyro.infer.mcmc import MCMC, NUTS
from pyro.ops.stats import effective_sample_size, split_gelman_rubin

from ..gp import DeepGP
from ..prediction import MixturePredictive
from ..rng import seeded
from ..validation import check_inputs, check_positive_int
from .target import GoldTarget, check_gold_model, fixed_hyperparameters

__all__ = ["GoldStandard", "run_nuts"]


@dataclass
class GoldStandard:
    """NUTS draws of ``q*(U)`` and their diagnostics.

    :ivar model: the deep GP (its hyperparameters as they were sampled under).
    :ivar samples: ``{"<layer>.u": (C, S, D_out, M)}``: ``S`` draws of each of ``C`` chains.
    :ivar divergences: divergent transitions after warm-up, per chain.
    :ivar ess: the smallest effective sample size over the entries of ``U``, per chain
        (Pyro's estimator, within each chain).
    :ivar r_hat: the largest split-R-hat over the entries of ``U``, all chains together: near
        1 where the chains agree, large where they sit in different modes.
    :ivar step_size: each chain's adapted step size.
    :ivar seconds: wall time of the sampling, per chain.
    :ivar settings: the sampler's settings, for the record.
    """

    model: DeepGP
    samples: dict[str, torch.Tensor]
    divergences: list[int] = field(default_factory=list)
    ess: list[float] = field(default_factory=list)
    r_hat: float = float("nan")
    step_size: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    def draws(self, chains=None) -> dict[str, torch.Tensor]:
        """``{"<layer>.u": (C' S, D_out, M)}``, the draws of ``chains`` (default all) pooled."""
        chains = range(self.num_chains) if chains is None else list(chains)
        return {k: v[list(chains)].flatten(0, 1) for k, v in self.samples.items()}

    def layer_values(self, X: torch.Tensor, layer: str | None = None,
                     seed: int | None = 0) -> torch.Tensor:
        """``(C S, N, D_l)``: draws of ``f^l`` at ``X`` (layer ``layer``, default the last),
        one per draw of ``U``, the layers' values drawn per point from their conditionals
        (the last layer's too). Seeded; the global random state is left as it was."""
        names = [lay.name for lay in self.model.layers]
        if layer is not None and layer not in names:
            raise ValueError(f"no layer {layer!r} in the model (layers {names})")
        stop = names.index(layer) if layer is not None else len(names) - 1
        return self._propagate(X, seed, stop, keep_last_gaussian=False)

    def predict(self, X: torch.Tensor, seed: int | None = 0) -> MixturePredictive:
        """The predictive mixture at ``X``: one component per draw of ``U`` (all chains), the
        last layer's Gaussian given the inner layers' per-point draws (module docstring)."""
        loc, var = self._propagate(X, seed, len(self.model.layers) - 1,
                                   keep_last_gaussian=True)
        return MixturePredictive(loc.squeeze(-1), var.squeeze(-1), self.model.likelihood,
                                 mc_seed=0 if seed is None else seed)

    def _propagate(self, X, seed, stop: int, keep_last_gaussian: bool):
        check_inputs(X, self.model.input_dim)
        draws = self.draws()
        h = X
        with torch.no_grad(), seeded(seed, X.device):
            for i, layer in enumerate(self.model.layers[: stop + 1]):
                loc, var = layer.conditional(h, draws[f"{layer.name}.u"])  # (C S, N, D)
                if i == stop and keep_last_gaussian:
                    return loc, var
                h = loc + var.clamp_min(0).sqrt() * torch.randn_like(loc)
        return h


def run_nuts(model: DeepGP, X: torch.Tensor, y: torch.Tensor, *, num_samples: int = 500,
             warmup_steps: int = 500, num_chains: int = 4, seed: int = 0,
             num_quadrature: int = 20, full_mass: bool = False, max_tree_depth: int = 10,
             target_accept_prob: float = 0.8, progress: bool = True) -> GoldStandard:
    """NUTS on ``q*(U)`` of ``model`` at ``(X, y)`` with the hyperparameters fixed.

    :param model: a small :class:`~pyro_dgp.DeepGP` with fixed inducing inputs.
    :param X: ``(N, D)`` training inputs; :param y: ``(N,)`` targets (all of them).
    :param num_samples: ``S`` kept draws per chain, after ``warmup_steps`` adaptation steps.
    :param num_chains: ``C`` chains, one after another, chain ``c`` seeded ``seed + c`` and
        started from a draw of the prior (torch's global random state is left as it was).
    :param num_quadrature: Gauss-Hermite nodes per inner output dimension of ``g(U)``.
    :param full_mass: adapt a dense mass matrix (default diagonal).
    :param progress: Pyro's progress bar per chain.
    :returns: :class:`GoldStandard`.
    """
    check_gold_model(model)
    S = check_positive_int(num_samples, "num_samples")
    W = check_positive_int(warmup_steps, "warmup_steps", allow_zero=True)
    C = check_positive_int(num_chains, "num_chains")
    Q = check_positive_int(num_quadrature, "num_quadrature")
    target = GoldTarget(model, X, y, Q)
    gold = GoldStandard(model, {}, settings={
        "num_samples": S, "warmup_steps": W, "num_chains": C, "seed": seed,
        "num_quadrature": Q, "full_mass": full_mass, "max_tree_depth": max_tree_depth,
        "target_accept_prob": target_accept_prob})

    def potential(params):
        return -target.log_density(params)

    chains: list[dict[str, torch.Tensor]] = []
    with fixed_hyperparameters(model):
        for c in range(C):
            # each chain from its own seed; the caller's random state is left as it was
            with seeded(seed + c, X.device):
                start = {name: prior.sample() for name, prior in
                         zip(target.names, target.priors, strict=True)}
                kernel = NUTS(potential_fn=potential, full_mass=full_mass,
                              max_tree_depth=max_tree_depth,
                              target_accept_prob=target_accept_prob)
                mcmc = MCMC(kernel, num_samples=S, warmup_steps=W, initial_params=start,
                            disable_progbar=not progress)
                t0 = time.perf_counter()
                mcmc.run()
                gold.seconds.append(time.perf_counter() - t0)
            chains.append({k: v.detach() for k, v in mcmc.get_samples().items()})
            gold.divergences.append(int(sum(len(d) for d in
                                            mcmc.diagnostics()["divergences"].values())))
            gold.step_size.append(float(kernel.step_size))
    gold.samples = {k: torch.stack([ch[k] for ch in chains]) for k in chains[0]}
    flat = torch.cat([v.flatten(2) for v in gold.samples.values()], -1)  # (C, S, T)
    gold.ess = [float(effective_sample_size(flat[c:c + 1], 0, 1).min()) for c in range(C)]
    if C > 1 and S >= 4:
        gold.r_hat = float(split_gelman_rubin(flat, 0, 1).max())
    return gold
