"""``run_nuts``: the gold standard, Pyro's NUTS (Hoffman and Gelman 2014) on a small deep GP with
the hyperparameters held fixed, its chains combined by stacking, and its predictive.

Two targets, each a density over one value per sampled site:

- ``target="posterior"`` (the default): the deep GP's posterior ``p(U, F_inner | y)`` of
  :mod:`pyro_dgp.gold.posterior`: every layer's ``u`` and the inner layers' values at the
  training inputs (as standard normals, non-centred), the last layer's ``f`` integrated out
  in closed form (Gaussian likelihood). The truth a "gold standard" is expected to be.
- ``target="elbo_optimum"``: ``q*(U) = p(U) exp(g(U)) / Z`` of :mod:`pyro_dgp.gold.target`,
  the best ``q(U)`` any guide of the library can reach (its ELBO is ``log Z - KL(q || q*)``):
  the comparator for how far a guide is from what its family could do.

NUTS runs on the potential ``-log density`` (no Pyro model is traced per step). Chains run
one after another (or side by side in processes, ``jobs``), each from its own prior draw and
its own seed ``seed + c``; NUTS does not
cross between well-separated modes, so several chains are what finds several modes. The chains
are then grouped (chains that agree, by pairwise split-R-hat) and the groups weighed by
stacking of their leave-one-out predictive densities (Yao, Vehtari and Gelman 2022;
:mod:`.chains`), not by the share of chains that happened to start near each mode.

The predictive at test inputs follows a guide's (:func:`~pyro_dgp.predict`): per draw, each
inner layer's ``f`` is drawn per point from its conditional, and the last layer's Gaussian
``N(loc, var)`` is kept, so the result is the same
:class:`~pyro_dgp.prediction.MixturePredictive`; under the posterior target each layer's
conditional also conditions on the draw's values at the training inputs (and the last layer's
on ``y``). The draws behind it are the groups' draws resampled to their stacking weights
(:meth:`GoldStandard.weighted_draws`), an equally weighted set as :mod:`.distance` takes.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field

import torch
from pyro.infer.mcmc import MCMC, NUTS
from pyro.ops.stats import effective_sample_size, split_gelman_rubin

from ..gp import DeepGP
from ..prediction import MixturePredictive
from ..processes import process_count, run_here_and_in_workers, tensors_from_bytes, tensors_to_bytes
from ..rng import seeded
from ..validation import check_inputs, check_positive_int
from .chains import ChainGroups, combine_chains
from .posterior import PosteriorTarget
from .target import GoldTarget, check_gold_model, fixed_hyperparameters

__all__ = ["TARGETS", "GoldStandard", "run_nuts"]

#: the densities ``run_nuts`` samples (module docstring)
TARGETS = ("posterior", "elbo_optimum")

#: draws per batch when evaluating the targets over all draws
_CHUNK = 256


@dataclass
class GoldStandard:
    """NUTS draws of the gold standard's target and their diagnostics.

    :ivar model: the deep GP (its hyperparameters as they were sampled under).
    :ivar samples: ``{site: (C, S, *event)}``: ``S`` draws of each of ``C`` chains, the sites
        ``"<layer>.u"`` ``(D_out, M)`` and, under the posterior target,
        ``"<layer>.f_white"`` ``(N, D_out)`` of the inner layers.
    :ivar target: ``"posterior"`` or ``"elbo_optimum"`` (module docstring).
    :ivar X, y: the training data (the posterior's predictive conditions on them).
    :ivar chain_groups: the chains' groups, their stacking weights and per-group R-hat and
        ESS (:class:`~pyro_dgp.gold.chains.ChainGroups`); ``None``: all chains one group.
    :ivar divergences: divergent transitions after warm-up, per chain.
    :ivar ess: the smallest effective sample size over the sampled entries, per chain
        (Pyro's estimator, within each chain).
    :ivar r_hat: the largest split-R-hat over the sampled entries, all chains together: near
        1 where the chains agree, large where they sit in different modes (see
        ``chain_groups`` for R-hat within each group).
    :ivar step_size: each chain's adapted step size.
    :ivar seconds: wall time of the sampling, per chain.
    :ivar settings: the sampler's settings, for the record.
    """

    model: DeepGP
    samples: dict[str, torch.Tensor]
    target: str = "elbo_optimum"
    X: torch.Tensor | None = None
    y: torch.Tensor | None = None
    chain_groups: ChainGroups | None = None
    divergences: list[int] = field(default_factory=list)
    ess: list[float] = field(default_factory=list)
    r_hat: float = float("nan")
    step_size: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    @property
    def groups(self) -> list[list[int]]:
        """The chains of each group (one group of all chains where none were formed)."""
        if self.chain_groups is None:
            return [list(range(self.num_chains))]
        return self.chain_groups.groups

    @property
    def weights(self) -> torch.Tensor:
        """``(G,)`` the groups' stacking weights."""
        if self.chain_groups is None:
            return torch.ones(1, dtype=torch.float64)
        return self.chain_groups.weights

    def draws(self, chains=None) -> dict[str, torch.Tensor]:
        """``{site: (C' S, *event)}``, the draws of ``chains`` (default all) pooled, each
        with equal weight."""
        chains = range(self.num_chains) if chains is None else list(chains)
        return {k: v[list(chains)].flatten(0, 1) for k, v in self.samples.items()}

    def draw_weights(self) -> torch.Tensor:
        """``(C, S)``: each draw's weight, its group's stacking weight shared equally by the
        group's draws (sums to 1)."""
        first = next(iter(self.samples.values()))
        C, S = first.shape[:2]
        out = torch.zeros(C, S, dtype=torch.float64)
        for group, w in zip(self.groups, self.weights.tolist(), strict=True):
            out[group] = w / (len(group) * S)
        return out

    def weighted_draws(self) -> dict[str, torch.Tensor]:
        """``{site: (C S, *event)}``: the draws resampled to the groups' stacking weights,
        an equally weighted set of the same size. Group ``g`` gets ``round(w_g C S)`` draws
        (largest remainders), evenly spaced over its pooled draws (every draw once where
        that count is its size): deterministic, so the same for every call."""
        C, S = next(iter(self.samples.values())).shape[:2]
        counts = _largest_remainder(self.weights.double() * C * S)
        index = []
        for group, count in zip(self.groups, counts, strict=True):
            pooled = torch.tensor([c * S + s for c in group for s in range(S)])
            pick = (torch.arange(count, dtype=torch.float64) * len(pooled) / max(count, 1))
            index.append(pooled[pick.long()])
        index = torch.cat(index)
        return {k: v.flatten(0, 1)[index.to(v.device)] for k, v in self.samples.items()}

    def layer_values(self, X: torch.Tensor, layer: str | None = None,
                     seed: int | None = 0) -> torch.Tensor:
        """``(C S, N, D_l)``: draws of ``f^l`` at ``X`` (layer ``layer``, default the last),
        one per weighted draw (:meth:`weighted_draws`), the layers' values drawn per point
        from their conditionals (the last layer's too). Seeded; the global random state is
        left as it was."""
        names = [lay.name for lay in self.model.layers]
        if layer is not None and layer not in names:
            raise ValueError(f"no layer {layer!r} in the model (layers {names})")
        stop = names.index(layer) if layer is not None else len(names) - 1
        return self._propagate(X, seed, stop, keep_last_gaussian=False)

    def predict(self, X: torch.Tensor, seed: int | None = 0) -> MixturePredictive:
        """The predictive mixture at ``X``: one component per weighted draw, the last layer's
        Gaussian given the inner layers' per-point draws (module docstring)."""
        loc, var = self._propagate(X, seed, len(self.model.layers) - 1,
                                   keep_last_gaussian=True)
        return MixturePredictive(loc.squeeze(-1), var.squeeze(-1), self.model.likelihood,
                                 mc_seed=0 if seed is None else seed)

    def _propagate(self, X, seed, stop: int, keep_last_gaussian: bool):
        check_inputs(X, self.model.input_dim)
        draws = self.weighted_draws()
        with torch.no_grad(), seeded(seed, X.device):
            if self.target == "posterior":
                if self.X is None or self.y is None:
                    raise ValueError("a posterior gold standard needs its training data X, y")
                posterior = PosteriorTarget(self.model, self.X, self.y)
                return posterior.propagate(draws, X, stop, keep_last_gaussian)
            h = X
            for i, layer in enumerate(self.model.layers[: stop + 1]):
                loc, var = layer.conditional(h, draws[f"{layer.name}.u"])  # (C S, N, D)
                if i == stop and keep_last_gaussian:
                    return loc, var
                h = loc + var.clamp_min(0).sqrt() * torch.randn_like(loc)
        return h


def _largest_remainder(shares: torch.Tensor) -> list[int]:
    """Integers summing to ``round(sum(shares))``, each the floor of its share plus one for
    the largest remainders."""
    floor = shares.floor()
    left = int(round(float(shares.sum() - floor.sum())))
    order = torch.argsort(shares - floor, descending=True)
    counts = floor.long()
    counts[order[:left]] += 1
    return counts.tolist()


def _make_target(target: str, model, X, y, num_quadrature: int):
    if target == "posterior":
        return PosteriorTarget(model, X, y)
    if target == "elbo_optimum":
        return GoldTarget(model, X, y, num_quadrature)
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")


def _loo_log_likelihood(target, samples: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(C, S, N)``: per draw, ``log p(y_n | y_-n, draw)`` (the points are independent
    given ``U`` under the ELBO-optimum target's per-point model)."""
    C, S = next(iter(samples.values())).shape[:2]
    flat = {k: v.flatten(0, 1) for k, v in samples.items()}
    out = []
    with torch.no_grad():
        for lo in range(0, C * S, _CHUNK):
            chunk = {k: v[lo:lo + _CHUNK] for k, v in flat.items()}
            if isinstance(target, PosteriorTarget):
                out.append(target.loo_log_likelihood(chunk))
            else:
                out.append(target.log_likelihood(chunk))
    return torch.cat(out).reshape(C, S, -1)


def _run_chain(density, settings: dict, seed: int, device, S: int, W: int) -> tuple:
    """One chain of NUTS on ``density`` from a prior draw, seeded by ``seed`` (the caller's
    random state left as it was): ``(draws by site, seconds, divergences, step size)``."""
    with seeded(seed, device):
        start = {name: prior.sample() for name, prior in
                 zip(density.names, density.priors, strict=True)}
        kernel = NUTS(potential_fn=lambda params: -density.log_density(params),
                      full_mass=settings["full_mass"],
                      max_tree_depth=settings["max_tree_depth"],
                      target_accept_prob=settings["target_accept_prob"])
        mcmc = MCMC(kernel, num_samples=S, warmup_steps=W, initial_params=start,
                    disable_progbar=not settings["progress"])
        t0 = time.perf_counter()
        mcmc.run()
        seconds = time.perf_counter() - t0
    divergences = int(sum(len(d) for d in mcmc.diagnostics()["divergences"].values()))
    return ({k: v.detach() for k, v in mcmc.get_samples().items()}, seconds, divergences,
            float(kernel.step_size))


def _chain_in_worker(payload: bytes) -> tuple:
    """In a worker process: :func:`_run_chain` of a pickled job, its draws as bytes."""
    density, settings, seed, device, S, W = pickle.loads(payload)  # from run_nuts's process
    draws, *stats = _run_chain(density, settings, seed, device, S, W)
    return (tensors_to_bytes(draws), *stats)


def _run_chains(density, settings: dict, seeds: list[int], device, S: int, W: int,
                workers: int) -> list[tuple]:
    """:func:`_run_chain` for each seed: one after another, or the first here and the others
    in ``workers - 1`` spawned processes (:mod:`pyro_dgp.processes`)."""
    if workers == 1:
        return [_run_chain(density, settings, seed, device, S, W) for seed in seeds]
    quiet = dict(settings, progress=False)
    try:
        payloads = [pickle.dumps((density, quiet, seed, device, S, W),
                                 protocol=pickle.HIGHEST_PROTOCOL) for seed in seeds[1:]]
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise TypeError(
            f"run_nuts(jobs={workers}) sends the model and data to worker processes by pickle, "
            f"which failed ({error}); build the model from classes and functions at a module's "
            "top level, or pass jobs=1") from None
    first, sent = run_here_and_in_workers(
        lambda: _run_chain(density, settings, seeds[0], device, S, W), _chain_in_worker,
        payloads, workers)
    return [first] + [(tensors_from_bytes(draws, map_location=device), *stats)
                      for draws, *stats in sent]


def run_nuts(model: DeepGP, X: torch.Tensor, y: torch.Tensor, *, target: str = "posterior",
             num_samples: int = 500, warmup_steps: int = 500, num_chains: int = 4,
             seed: int = 0, num_quadrature: int = 20, full_mass: bool = False,
             max_tree_depth: int = 10, target_accept_prob: float = 0.8,
             progress: bool = True, jobs: int | str = 1) -> GoldStandard:
    """NUTS on ``target`` of ``model`` at ``(X, y)`` with the hyperparameters fixed, the
    chains grouped and weighed by stacking (module docstring).

    :param model: a small :class:`~pyro_dgp.DeepGP` with fixed inducing inputs (the
        posterior target: a Gaussian likelihood and at most
        :data:`~pyro_dgp.gold.posterior.MAX_POSTERIOR_POINTS` training points).
    :param X: ``(N, D)`` training inputs; :param y: ``(N,)`` targets (all of them).
    :param target: ``"posterior"`` (default), the deep GP's posterior, or
        ``"elbo_optimum"``, the ELBO's optimal ``q*(U)``.
    :param num_samples: ``S`` kept draws per chain, after ``warmup_steps`` adaptation steps.
    :param num_chains: ``C`` chains, one after another, chain ``c`` seeded ``seed + c`` and
        started from a draw of the prior (torch's global random state is left as it was).
    :param num_quadrature: Gauss-Hermite nodes per inner output dimension of ``g(U)`` (the
        ELBO-optimum target only).
    :param full_mass: adapt a dense mass matrix (default diagonal).
    :param progress: Pyro's progress bar per chain (the first chain's only, with ``jobs > 1``).
    :param jobs: processes that run the chains: 1 (default) runs them one after another here;
        ``n`` runs the first here and the others in ``n - 1`` spawned worker processes of one
        torch thread each (:mod:`pyro_dgp.processes`; the model and data travel by pickle,
        so a script must start under ``if __name__ == "__main__":``); ``"auto"``: one per
        usable CPU core, up to ``num_chains`` (1 on a GPU). With one torch thread here, a
        chain's draws are the same in either place.
    :returns: :class:`GoldStandard`; with ``S >= 4``, its chains grouped and weighed
        (:func:`~pyro_dgp.gold.chains.combine_chains`, which warns
        :class:`~pyro_dgp.gold.chains.GoldMixingWarning` for a group that did not mix).
    """
    check_gold_model(model)
    S = check_positive_int(num_samples, "num_samples")
    W = check_positive_int(warmup_steps, "warmup_steps", allow_zero=True)
    C = check_positive_int(num_chains, "num_chains")
    Q = check_positive_int(num_quadrature, "num_quadrature")
    density = _make_target(target, model, X, y, Q)
    gold = GoldStandard(model, {}, target=target, X=X, y=y, settings={
        "target": target, "num_samples": S, "warmup_steps": W, "num_chains": C, "seed": seed,
        "num_quadrature": Q, "full_mass": full_mass, "max_tree_depth": max_tree_depth,
        "target_accept_prob": target_accept_prob, "progress": progress})

    workers = process_count(jobs, C, X.device)
    with fixed_hyperparameters(model):
        chains = _run_chains(density, gold.settings, [seed + c for c in range(C)], X.device, S,
                             W, workers)
        for _, seconds, divergences, step_size in chains:
            gold.seconds.append(seconds)
            gold.divergences.append(divergences)
            gold.step_size.append(step_size)
        gold.samples = {k: torch.stack([ch[0][k] for ch in chains]) for k in density.names}
        flat = torch.cat([v.flatten(2) for v in gold.samples.values()], -1)  # (C, S, T)
        gold.ess = [float(effective_sample_size(flat[c:c + 1], 0, 1).min()) for c in range(C)]
        if C > 1 and S >= 4:
            gold.r_hat = float(split_gelman_rubin(flat, 0, 1).max())
        if S >= 4:
            gold.chain_groups = combine_chains(flat, _loo_log_likelihood(density, gold.samples))
    return gold
