"""Write ``BENCHMARKS.md`` from ``benchmarks/results/*.jsonl``: per benchmark, a table of the
latest record of each configuration, with its date, commit and command.

``python benchmarks/report.py`` rewrites the file; ``--check`` exits 1 if it is out of date.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from results import default_dir, read

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("uci", "compositional", "compositional_elbo_terms", "speed", "speed_guides", "threads",
         "exact_gp", "amortized", "scale", "semi_implicit")
TITLES = {
    "uci": "UCI regression",
    "amortized": "Amortized guides (AVDGP, Meng and Zhang 2024) against DS-DGP, standardised "
                 "units; AVDGP's time per epoch on synthetic data",
    "compositional": "Compositional uncertainty (Table 1 of Ustyuzhaninov et al. 2020)",
    "compositional_elbo_terms": "Compositional uncertainty: the ELBO's terms",
    "speed": "Step time against GPyTorch and the plain floor",
    "speed_guides": "Step time of fit by guide, eager and replayed from a CUDA graph",
    "threads": "Step time by torch thread count, on a quiet and on a busy machine",
    "exact_gp": "Exact-GP control",
    "semi_implicit": "Semi-implicit guides against the gold standard (NUTS on the ELBO's optimal "
                     "q(U), hyperparameters fixed; distances of each guide's predictive of f "
                     "to NUTS's on a grid) and SSIVI against MeanField on UCI",
    "scale": "Scale: time per epoch and peak memory against N, one process and data-parallel "
             "(benchmarks/scale.py; epoch_extrapolated: fewer steps than an epoch were timed)",
}
#: figures that also identify a configuration: a run on fewer splits is another configuration
IDENTIFYING_FIGURES = {"uci": ("splits",), "exact_gp": ("splits",), "amortized": ("splits",),
                       "semi_implicit": ("splits",)}
#: settings the rows are sorted by first (then every settings column in turn)
SORT_FIRST = {"compositional": ("noise", "lr_decay", "steps"),
              "scale": ("reader", "rows", "processes")}

SALIMBENI = "Salimbeni and Deisenroth 2017"
USTYUZHANINOV = "Ustyuzhaninov et al. 2020"
#: (dataset, model) -> published test log-likelihood and RMSE, mean (standard error) over the
#: paper's splits at its protocol (20,000 iterations; M = 100)
PUBLISHED_UCI = {
    ("boston", "DGP 2"): ("-2.47 (0.05)", "2.90 (0.17)"),
    ("boston", "DGP 3"): ("-2.49 (0.05)", "2.93 (0.16)"),
    ("concrete", "DGP 2"): ("-3.12 (0.01)", "5.61 (0.10)"),
    ("concrete", "DGP 3"): ("-3.13 (0.01)", "5.64 (0.10)"),
    ("energy", "DGP 2"): ("-0.73 (0.02)", "0.47 (0.01)"),
    ("energy", "DGP 3"): ("-0.75 (0.02)", "0.48 (0.01)"),
    ("wine_red", "DGP 2"): ("-0.95 (0.01)", "0.63 (0.01)"),
    ("wine_red", "DGP 3"): ("-0.95 (0.01)", "0.63 (0.01)"),
    ("kin8nm", "DGP 2"): ("1.34 (0.01)", "0.06 (0.00)"),
    ("kin8nm", "DGP 3"): ("1.37 (0.01)", "0.06 (0.00)"),
    ("power", "SGP"): ("-2.79 (0.01)", "3.91 (0.03)"),
    ("power", "DGP 2"): ("-2.75 (0.01)", "3.79 (0.03)"),
    ("power", "DGP 3"): ("-2.74 (0.01)", "3.73 (0.04)"),
    ("naval", "DGP 2"): ("6.76 (0.19)", None),
    ("naval", "DGP 3"): ("6.62 (0.18)", None),
    ("protein", "SGP"): ("-2.91 (0.00)", None),
    ("protein", "DGP 2"): ("-2.81 (0.00)", "4.00 (0.03)"),
    ("protein", "DGP 3"): ("-2.75 (0.00)", "3.81 (0.04)"),
}
#: family -> the paper's Table 1 row (mean +- sd over its 10 trials, on its own toy data)
_LOCATIONS = "ELBO 36.31 ± 3.55; Var[f1(0)] 2.22e-3 ± 2.73e-4; Var[f2(0)] 4.98e-2 ± 7.78e-3"
PUBLISHED_COMPOSITIONAL = {
    "mean-field": "Var[f1(0)] 1.99e-6 ± 1.76e-7",
    "coupled": "ELBO 23.15 ± 6.80; Var[f1(0)] 4.23e-5 ± 3.17e-6; Var[f2(0)] 3.33e-4 ± 2.12e-5",
    "inducing-as-locations": _LOCATIONS,
    "inducing-as-locations (whitened last layer)": _LOCATIONS,
}


def _published_uci(settings: dict) -> str:
    pub = PUBLISHED_UCI.get((settings.get("dataset"), settings.get("model")))
    return "" if pub is None else f"{pub[0]} / {pub[1] or '—'}"


def _published_compositional(settings: dict) -> str:
    return PUBLISHED_COMPOSITIONAL.get(settings.get("family"), "")


MENG_ZHANG = "Meng and Zhang 2024"
#: (dataset, method) -> their Table 5 (NLL / RMSE / CRPS, mean ± sd over 5 random 8:1:1
#: splits, standardised units) and Table 4 (training seconds per epoch, RTX 3090); power is
#: not among their data sets
PUBLISHED_AMORTIZED = {
    ("kin8nm", "dsdgp"): "0.290±0.024 / 0.316±0.006 / 0.195±0.005; 3.45 s/epoch",
    ("kin8nm", "ar1"): "0.157±0.014 / 0.282±0.003 / 0.174±0.002",
    ("kin8nm", "ar2"): "0.171±0.039 / 0.279±0.007 / 0.175±0.004",
    ("kin8nm", "ar2p"): "0.118±0.037 / 0.266±0.007 / 0.168±0.004; AVDGP 3.17 s/epoch",
    ("kin8nm", "ar2pp"): "0.066±0.022 / 0.263±0.004 / 0.161±0.005",
    ("protein", "dsdgp"): "1.036±0.007 / 0.688±0.005 / 0.423±0.003; 19.38 s/epoch",
    ("protein", "ar1"): "0.957±0.010 / 0.641±0.007 / 0.379±0.003",
    ("protein", "ar2"): "0.950±0.015 / 0.635±0.006 / 0.371±0.006",
    ("protein", "ar2p"): "0.910±0.012 / 0.628±0.007 / 0.357±0.003; AVDGP 17.80 s/epoch",
    ("protein", "ar2pp"): "0.226±0.028 / 0.690±0.006 / 0.324±0.006",
}


def _published_amortized(settings: dict) -> str:
    return PUBLISHED_AMORTIZED.get((settings.get("dataset"), settings.get("method")), "")


#: benchmark -> (column label, the published figures of a row's settings)
PUBLISHED = {
    "uci": (f"published log-lik / RMSE ({SALIMBENI})", _published_uci),
    "compositional": (f"published ({USTYUZHANINOV})", _published_compositional),
    "amortized": (f"published NLL / RMSE / CRPS ({MENG_ZHANG})", _published_amortized),
}

HEADER = """# Benchmarks

Generated by `python benchmarks/report.py` from the JSON lines in
[benchmarks/results/](benchmarks/results/); do not edit it by hand. Each benchmark appends one
line per measured configuration (command, machine, date, commit, settings, figures; the fields
are described in `benchmarks/results.py`), and `python benchmarks/report.py --check` fails when
this file is out of date.

Each table shows the latest record of every configuration: a configuration is a record's
settings (for UCI and the exact GP also the number of splits run), and the latest is by date,
then session, then order in the file. Earlier records of a configuration stay in its JSON
lines. Records marked with a session or "log" were copied from the log of the earlier
sessions, kept as written in [benchmarks/results/history.md](benchmarks/results/history.md) (a
record's `source_line` is the line of its figures there). Settings shared by every row are
listed above the table. Figures: mean (standard error) or mean ± sd as recorded; "published"
columns are the papers' figures, not ours, cited beside ours for comparison.
"""


def configuration(rec: dict) -> str:
    """The key of a record's configuration: its settings (and identifying figures)."""
    key = dict(rec.get("settings") or {})
    for name in IDENTIFYING_FIGURES.get(rec.get("benchmark"), ()):
        key[f"figures.{name}"] = (rec.get("figures") or {}).get(name)
    return json.dumps(key, sort_keys=True)


def _when(indexed: tuple[int, dict]) -> tuple:
    index, rec = indexed
    return (str(rec.get("date") or "")[:10], rec.get("session") or 0, index)


def latest_per_configuration(records: list[dict]) -> list[dict]:
    """The latest record of each configuration: by date (the day), then session, then order
    in ``records``."""
    out: dict[str, tuple] = {}
    for indexed in enumerate(records):
        key = configuration(indexed[1])
        if key not in out or _when(indexed) >= _when(out[key]):
            out[key] = indexed
    return [rec for _, rec in sorted(out.values(), key=lambda item: item[0])]


def flatten(figures: dict, prefix: str = "") -> dict:
    """``{"ms": {"ours": 1}}`` -> ``{"ms.ours": 1}``."""
    out = {}
    for name, value in figures.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def number(value) -> str:
    """A figure as written: the shortest repr of a float, or 4 significant digits where that
    has more than 6."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    text = repr(value)
    digits = text.split("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return text if len(digits) <= 6 else f"{value:.4g}"


def _figure_columns(flats: list[dict]) -> list[tuple[str, str]]:
    """``(name, label)`` per column; ``x_se`` / ``x_sd`` and ``num_splits`` join their base."""
    names = list(dict.fromkeys(k for f in flats for k in f))
    columns = []
    for name in names:
        if name == "num_splits" and "splits" in names:
            continue
        if name.endswith(("_se", "_sd")) and name[:-3] in names:
            continue
        label = name
        if any(f.get(f"{name}_se") is not None for f in flats):
            label += " (se)"
        elif any(f.get(f"{name}_sd") is not None for f in flats):
            label += " ± sd"
        columns.append((name, label))
    return columns


def _figure_cell(flat: dict, name: str) -> str:
    text = number(flat.get(name))
    if not text:
        return ""
    if name == "splits" and flat.get("num_splits") is not None:
        return f"{text}/{number(flat['num_splits'])}"
    if flat.get(f"{name}_se") is not None:
        return f"{text} ({number(flat[name + '_se'])})"
    if flat.get(f"{name}_sd") is not None:
        return f"{text} ± {number(flat[name + '_sd'])}"
    return text


def _sort_key(columns: list[str]):
    def key(rec: dict) -> tuple:
        values = [rec["settings"].get(c) for c in columns]
        return tuple((2, "") if v is None else (0, v, "") if isinstance(v, int | float)
                     else (1, 0, str(v)) for v in values)
    return key


def _when_cell(rec: dict) -> str:
    text = str(rec.get("date") or "")[:10]
    if rec.get("session") is not None:
        return f"{text} (session {rec['session']})".strip()
    return f"{text} (log)" if rec.get("source") else text


def _provenance(rec: dict) -> str:
    note = f" ({rec['note']})" if rec.get("note") else ""
    return f"`{rec.get('command')}`{note}" if rec.get("command") else f"no command{note}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def table(benchmark: str, records: list[dict]) -> list[str]:
    """The Markdown lines of one benchmark's table, its shared settings and its commands."""
    settings = list(dict.fromkeys(k for r in records for k in r["settings"]))
    shared = [k for k in settings if all(k in r["settings"] for r in records)
              and len({json.dumps(r["settings"][k]) for r in records}) == 1]
    keys = [k for k in settings if k not in shared]
    flats = [flatten(r.get("figures") or {}) for r in records]
    figures = _figure_columns(flats)
    label, published = PUBLISHED.get(benchmark, (None, None))
    first = [k for k in SORT_FIRST.get(benchmark, ()) if k in keys]
    rows = sorted(zip(records, flats, strict=True),
                  key=lambda rf: _sort_key(first + keys)(rf[0]))
    provenance: list[str] = []
    lines = [_row(keys + [lab for _, lab in figures] + ([label] if label else [])
                  + ["date", "commit", "cmd"]), "|" + "---|" * (len(keys) + len(figures)
                                                                 + bool(label) + 3)]
    for rec, flat in rows:
        cells = [number(rec["settings"].get(k)) for k in keys]
        cells += [_figure_cell(flat, name) for name, _ in figures]
        cells += [published(rec["settings"])] if label else []
        commit = f"{rec.get('commit') or ''}{'+' if rec.get('dirty') else ''}"
        if _provenance(rec) not in provenance:
            provenance.append(_provenance(rec))
        cells += [_when_cell(rec), commit, f"[{provenance.index(_provenance(rec)) + 1}]"]
        lines.append(_row(cells))
    common = ", ".join(f"{k} {number(records[0]['settings'][k])}" for k in shared)
    head = [f"All rows: {common}.", ""] if common else []
    return head + lines + [""] + [f"[{i}] {p}" for i, p in enumerate(provenance, 1)] + [""]


def alpha_summary(records: list[dict]) -> list[str]:
    """The UCI rows of the local alpha objective (DGP 2, 5,000 steps, 3 splits) side by side:
    one line per data set and guide, one column per alpha, each cell ``test log-lik (se) /
    RMSE``, the line's best log-likelihood in bold."""
    by_line: dict[tuple, dict] = {}
    for rec in records:
        settings, figures = rec["settings"], rec.get("figures") or {}
        objective = str(settings.get("objective") or "")
        if (not objective.startswith("alpha=") or settings.get("model") != "DGP 2"
                or settings.get("steps") != 5000 or figures.get("splits") != 3
                or figures.get("test_loglik") is None):
            continue
        alpha = float(objective.split(",")[0].removeprefix("alpha="))
        by_line.setdefault((settings["dataset"], settings["guide"]), {})[alpha] = figures
    if not by_line:
        return []
    alphas = sorted({a for line in by_line.values() for a in line})
    lines = ["The local alpha objective, the rows above side by side (DGP 2, 5,000 steps, 3 "
             "splits): test log-lik (se) / RMSE; in bold the best log-lik of each line.", "",
             _row(["dataset", "guide", *[f"alpha {number(a)}" for a in alphas]]),
             "|" + "---|" * (2 + len(alphas))]
    for (dataset, guide), line in sorted(by_line.items()):
        best = max(line, key=lambda a: line[a]["test_loglik"])
        cells = []
        for a in alphas:
            f = line.get(a)
            text = "" if f is None else (f"{f['test_loglik']:.3f} ({f['test_loglik_se']:.3f}) / "
                                         f"{f['rmse']:.3g}")
            cells.append(f"**{text}**" if f is not None and a == best else text)
        lines.append(_row([dataset, guide, *cells]))
    return lines + [""]


def graph_summary(records: list[dict]) -> list[str]:
    """The GPU rows of the speed benchmark that time the step replayed from a CUDA graph
    (``graph``, what ``fit(cuda_graph=True)`` runs; ``plain-graph``, the floor replayed),
    beside the eager step and GPyTorch's: one line per layers, batch and dtype."""
    rows = []
    for rec in records:
        settings, ms = rec["settings"], (rec.get("figures") or {}).get("ms_per_step") or {}
        if settings.get("device") != "cuda" or "graph" not in ms:
            continue
        rows.append((settings["num_layers"], settings["batch_size"], settings["dtype"],
                     settings["num_inducing"], settings["hidden_dim"], ms))
    if not rows:
        return []

    def ratio(a, b):
        return "" if a is None or b is None else f"{a / b:.2f}"

    lines = ["The GPU rows above, the step replayed from a CUDA graph (`graph`: "
             "`fit(cuda_graph=True)`'s step; `plain-graph`: the plain floor replayed) beside "
             "the eager steps, ms per step:", "",
             _row(["layers", "M", "H", "batch", "dtype", "ours (eager)", "graph", "plain-graph",
                   "gpytorch", "graph / plain-graph", "graph / gpytorch"]),
             "|" + "---|" * 11]
    for L, B, dtype, M, H, ms in sorted(rows, key=lambda r: r[:5]):
        g, pg, gp = ms.get("graph"), ms.get("plain-graph"), ms.get("gpytorch")
        lines.append(_row([str(L), str(M), str(H), str(B), dtype, number(ms.get("ours")),
                           number(g), number(pg), number(gp), ratio(g, pg), ratio(g, gp)]))
    return lines + [""]


def _machines(records: list[dict]) -> str:
    names = set()
    for rec in records:
        machine = rec.get("machine")
        if isinstance(machine, dict):
            names.add(str(machine.get("cpu")) + (f", {machine['gpu']}" if machine.get("gpu")
                                                  else ""))
        elif isinstance(machine, str):
            names.add(machine.split(",")[0].strip())
    return ", ".join(sorted(names)) or "not recorded"


def _link(path: Path) -> str:
    try:
        name = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # results kept outside the repository
        return f"`{path.name}`"
    return f"[{name}]({name})"


def render(directory: Path) -> str:
    """The text of ``BENCHMARKS.md`` for the results in ``directory``."""
    names = [p.stem for p in directory.glob("*.jsonl")]
    out = [HEADER]
    for name in [n for n in ORDER if n in names] + sorted(set(names) - set(ORDER)):
        records = latest_per_configuration(read(name, directory))
        if not records:
            continue
        out += [f"## {TITLES.get(name, name)}", "",
                f"All records: {_link(directory / f'{name}.jsonl')}. "
                f"Machines of these rows: {_machines(records)}.", ""]
        out += table(name, records)
        if name == "uci":
            out += alpha_summary(records)
        if name == "speed":
            out += graph_summary(records)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if the file differs from what would be written")
    p.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"), help="the file to write")
    p.add_argument("--results-dir", default=None,
                   help="folder of the *.jsonl files (default: $PYRO_DGP_RESULTS_DIR, else "
                   "benchmarks/results)")
    args = p.parse_args(argv)
    text = render(Path(args.results_dir) if args.results_dir else default_dir())
    path = Path(args.output)
    if args.check:
        stale = not path.exists() or path.read_text(encoding="utf-8") != text
        if stale:
            print(f"{path} is out of date: run python benchmarks/report.py", file=sys.stderr)
        return int(stale)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
