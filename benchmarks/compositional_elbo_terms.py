"""Seed 003's toy: the ELBO of each family split into expected log-likelihood and per-layer KL.

Trains trial 0 of the families of ``pyro_dgp/bench/compositional.py`` (locations jitter 1e-4)
with lr 0.01 decayed to 0.001, then averages the terms over 400 guide draws and prints one JSON
line per family.

Run: ``python benchmarks/compositional_elbo_terms.py mean-field,coupled 16000``
"""

import json
import sys
import time

import pyro
import torch
from compositional import FAMILIES, build_model
from pyro import poutine
from pyro.distributions.kl import kl_divergence

from pyro_dgp import datasets
from pyro_dgp.train.training import fit


def _kl(guide_site, model_site) -> float:
    """Analytic where registered, else log q - log p at the draw (a joint guide's first site
    carries the whole KL this way)."""
    try:
        return float(kl_divergence(guide_site["fn"], model_site["fn"]).sum())
    except NotImplementedError:
        return float(guide_site["fn"].log_prob(guide_site["value"]).sum()
                     - model_site["fn"].log_prob(model_site["value"]).sum())


def terms(family: str, steps: int, draws: int = 400) -> dict:
    data = datasets.compositional_toy(dtype=torch.float64)
    X, y = data.X_train, data.y_train
    inducing, Guide = FAMILIES[family]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = build_model(X, y, inducing, locations_jitter=1e-4)
    guide = Guide(model)
    t0 = time.time()
    fit(model, guide, X, y, num_steps=steps, lr=0.01, seed=0, progress=False, lr_decay=0.1)
    parts = {"ell": [], "kl_layer1": [], "kl_layer2": []}
    with torch.no_grad():
        for _ in range(draws):
            gt = poutine.trace(guide).get_trace(X, y)
            mt = poutine.trace(poutine.replay(model, trace=gt)).get_trace(X, y)
            obs = mt.nodes["y"]
            parts["ell"].append(float(obs["fn"].log_prob(obs["value"]).sum() * obs["scale"]))
            for i in (1, 2):
                parts[f"kl_layer{i}"].append(_kl(gt.nodes[f"layer{i}.u"], mt.nodes[f"layer{i}.u"]))
    row = {"family": family, "steps": steps, "seconds": round(time.time() - t0),
           "noise_var": float(model.likelihood.variance.detach())}
    for k, v in parts.items():
        t = torch.tensor(v, dtype=torch.float64)
        row[k], row[k + "_se"] = round(float(t.mean()), 3), round(float(t.std() / len(t) ** 0.5), 3)
    row["elbo"] = round(row["ell"] - row["kl_layer1"] - row["kl_layer2"], 3)
    return row


if __name__ == "__main__":
    torch.set_num_threads(1)
    families = sys.argv[1].split(",") if len(sys.argv) > 1 else ["mean-field"]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 16000
    for fam in families:
        print(json.dumps(terms(fam, steps)), flush=True)
