"""The rows of the sections of ``BENCHMARKS.md`` whose table is not one row per record: the
defaults study (``defaults.py``: sets by objectives, with a rule row), the guide atlas
(``guides.py``: sets by guides, beside Lindinger et al. 2020's Table 1) and the kernel layouts
(``peers.py``: one kernel per layer against one per hidden GP, sets by peers).

Each ``*_rows`` function takes the latest record of each configuration and returns the rows
as records (``settings``, ``figures``, and the command, commit, date and machine of the
latest record behind the row, which is the row's run).
"""

from __future__ import annotations

__all__ = ["ATLAS_GUIDES", "INTEGER_TARGETS", "LINDINGER", "OBJECTIVES", "SET_ORDER",
           "KERNEL_PEERS", "atlas_goal_rows", "atlas_rows", "budget_goal_rows", "kernel_rows",
           "lindinger_cell", "summary_splits",
           "objective_cell", "objective_rows", "winners"]

#: UCI sets by training-set size, smallest first
SET_ORDER = ("yacht", "boston", "energy", "concrete", "wine_red", "kin8nm", "power", "naval",
             "protein")
#: the defaults study's objectives, as its records name them, and their headers
OBJECTIVES = {"auto": "ELBO, 1 draw", "auto,P=10": "ELBO, 10 draws", "alpha=0.5": "alpha 0.5",
              "alpha=1": "alpha 1", "stack": "stack"}
#: the two ELBO columns the ``draws`` row sets against each other: one draw per step, and
#: ``fit``'s default of 10
DRAWS_PAIR = ("auto", "auto,P=10")
#: the atlas's guides in the order of its rows
ATLAS_GUIDES = ("meanfield", "coupled", "chain", "ssivi", "ssivi-iwhvi", "ssivi-discrete",
                "amortized-ar2pp", "mixture", "stacked", "stacked, both objectives",
                "meanfield x5")
#: Lindinger et al. 2020, Table 1 (10 random 90/10 splits, M = 128, test log-likelihood):
#: SGHMC DGP (Havasi et al. 2018) best over L = 1..3, and the mean-field DGP with L = 2
LINDINGER = {"boston": ("-2.51 (L2)", "-2.43"), "energy": ("-0.34 (L3)", "-0.73"),
             "concrete": ("-2.88 (L3)", "-3.06"), "wine_red": ("-0.80 (L3)", "-0.89"),
             "kin8nm": ("1.38 (L2)", "1.30"), "power": ("-2.65 (L3)", "-2.77"),
             "naval": ("7.77 (L1)", "7.11"), "protein": ("-2.58 (L3)", "-2.83")}

#: sets whose targets take few integer values: the alpha objective's noise collapses there and
#: its test log-likelihood measures spikes on the integers (``benchmarks/results/history.md``,
#: "Defaults study and guide atlas, first session"), and so does AR2PP's (its per-point
#: inducing points), so the atlas's goal counts only ELBO fits of the DS-DGP families there
INTEGER_TARGETS = ("wine_red",)
#: the atlas's objective labels of ELBO-trained single fits
_ELBO = ("auto",)
#: atlas rows whose noise collapses on integer targets whatever the objective
_COLLAPSING = ("amortized-ar2pp",)

_RUN_FIELDS = ("command", "commit", "dirty", "date", "machine", "session")


def _rank(dataset: str) -> int:
    return SET_ORDER.index(dataset) if dataset in SET_ORDER else len(SET_ORDER)


def _latest(records: list[dict]) -> dict:
    return {k: v for k, v in max(records, key=lambda r: str(r.get("date") or "")).items()
            if k in _RUN_FIELDS}


def _most_splits(records: list[dict], key) -> dict[tuple, dict]:
    """Per ``key(record)``: the record over the most splits (the latest among equals)."""
    out: dict[tuple, dict] = {}
    for rec in records:
        k = key(rec)
        n = rec["settings"].get("splits", rec["figures"].get("splits", 0))
        old = out.get(k)
        if old is None or (n, str(rec.get("date"))) >= (
                old["settings"].get("splits", old["figures"].get("splits", 0)),
                str(old.get("date"))):
            out[k] = rec
    return out


def objective_cell(figures: dict | None) -> str:
    """``NLL (se) / RMSE (se)`` of one configuration, or empty."""
    if not figures or figures.get("test_loglik") is None:
        return ""

    def fmt(value: float, se: float | None) -> str:
        # three significant digits below 0.01 (naval's RMSE is about 1e-4)
        spec = ".2f" if abs(value) >= 1 else ".3f" if abs(value) >= 0.01 else ".3g"
        text = f"{value:{spec}}"
        return text if se is None else f"{text} ({se:{spec}})"

    return (f"{fmt(-figures['test_loglik'], figures.get('test_loglik_se'))} / "
            f"{fmt(figures['rmse'], figures.get('rmse_se'))}")


def winners(by_objective: dict[str, dict]) -> tuple[str | None, str | None]:
    """The objective with the lowest NLL and the one with the lowest RMSE (``None``: fewer
    than two objectives measured)."""
    have = {o: f for o, f in by_objective.items() if f and f.get("test_loglik") is not None}
    if len(have) < 2:
        return None, None
    nll = min(have, key=lambda o: -have[o]["test_loglik"])
    return nll, min(have, key=lambda o: have[o]["rmse"])


def objective_rows(records: list[dict]) -> list[dict]:
    """One row per (set, guide and held-out fraction, steps, batch, M): each objective's
    figures over its most splits, the winners, and a last row counting the wins of each
    objective."""
    best = _most_splits(records, lambda r: tuple((k, str(v)) for k, v in sorted(
        r["settings"].items()) if k != "splits"))
    groups: dict[tuple, dict[str, dict]] = {}
    for rec in best.values():
        s = rec["settings"]
        guide = (s["guide"] + (f", validation {s['validation']:g}" if s.get("validation") else "")
                 + (f", {s['lr_schedule']} schedule" if s.get("lr_schedule") else ""))
        key = (s["dataset"], guide, s.get("steps"), s.get("batch"), s.get("inducing"))
        groups.setdefault(key, {})[s["objective"]] = rec
    rows, wins = [], {o: [0, 0] for o in OBJECTIVES}
    pair = {o: [0, 0] for o in DRAWS_PAIR}
    for (dataset, guide, steps, batch, inducing), recs in groups.items():
        figures = {o: dict(r["figures"]) for o, r in recs.items()}
        nll, rm = winners(figures)
        for won, counts in (((nll, rm), wins),
                            (winners({o: figures.get(o) for o in DRAWS_PAIR}), pair)):
            for o, slot in zip(won, (0, 1), strict=True):
                if o in counts:
                    counts[o][slot] += 1
        splits = sorted({r["settings"].get("splits", 0) for r in recs.values()})
        rows.append({**_latest(list(recs.values())), "settings": {
            "rank": _rank(dataset), "dataset": dataset, "guide": guide, "steps": steps,
            "batch": batch, "inducing": inducing},
            "figures": {**figures, "splits": "/".join(map(str, splits)),
                        "best": f"{OBJECTIVES.get(nll, '—')} / {OBJECTIVES.get(rm, '—')}"}})
    if rows:
        shared = {k: rows[0]["settings"][k] for k in ("steps", "batch", "inducing")
                  if len({r["settings"][k] for r in rows}) == 1}
        rows.append({**_latest(records), "settings": {"rank": len(SET_ORDER) + 1,
                                                      "dataset": "rule", "guide": "", **shared},
                     "figures": {**{o: {"wins": w} for o, w in wins.items()}, "splits": "",
                                 "best": "rows won: NLL / RMSE"}})
        rows.append({**_latest(records), "settings": {"rank": len(SET_ORDER) + 2,
                                                      "dataset": "draws", "guide": "", **shared},
                     "figures": {**{o: {"wins": w} for o, w in pair.items()}, "splits": "",
                                 "best": "rows won of the two ELBO columns: NLL / RMSE"}})
    return rows


def atlas_rows(records: list[dict]) -> list[dict]:
    """The atlas's per-(set, guide) summaries (not its per-split lines), ranked for the table:
    sets by size, guides in :data:`ATLAS_GUIDES` order."""
    rows = []
    for rec in records:
        s = rec["settings"]
        if "split" in s:
            continue
        guide = s["guide"]
        rank = ATLAS_GUIDES.index(guide) if guide in ATLAS_GUIDES else len(ATLAS_GUIDES)
        rows.append({**rec, "settings": {"rank": _rank(s["dataset"]) * 100 + rank
                                         + (50 if s.get("validation") else 0), **s}})
    return rows


def lindinger_cell(dataset: str) -> str:
    """Lindinger et al. 2020's SGHMC (best L) / mean-field figures of a set, or empty."""
    pub = LINDINGER.get(dataset)
    return "" if pub is None else f"{pub[0]} / {pub[1]}"


def _counts(dataset: str, rec: dict) -> bool:
    """Whether an atlas row counts towards the goal: on :data:`INTEGER_TARGETS` only ELBO fits
    of the DS-DGP families (a stack may weigh alpha = 1 fits)."""
    s = rec["settings"]
    return dataset not in INTEGER_TARGETS or (s["objective"] in _ELBO
                                              and s["guide"] not in _COLLAPSING)


def _row_cell(rec: dict | None) -> str:
    if rec is None:
        return ""
    f = rec["figures"]
    return f"{f['test_loglik']:.3f} / {f['rmse']:#.3g}"


def _per_split(records: list[dict]) -> dict[str, dict[tuple, dict[int, dict]]]:
    """``{dataset: {(guide, objective, validation): {split: record}}}`` of the atlas's
    per-split lines that have a test log-lik."""
    out: dict[str, dict[tuple, dict[int, dict]]] = {}
    for rec in records:
        s = rec["settings"]
        if "split" in s and rec["figures"].get("test_loglik") is not None:
            label = (s["guide"], s["objective"], s.get("validation"))
            out.setdefault(s["dataset"], {}).setdefault(label, {})[s["split"]] = rec
    return out


def _common_splits(rows: dict[tuple, dict[int, dict]]) -> set[int]:
    """The splits a set's rows are compared on: those of its stacked row (the atlas's
    members fitted on the same splits), else those of the row with the most splits."""
    stacked = [set(by_split) for label, by_split in rows.items() if label[0] == "stacked"]
    return max(stacked or [set(by_split) for by_split in rows.values()], key=len)


def _over_splits(by_split: dict[int, dict], splits: set[int]) -> dict:
    """One row's record with its test log-lik and RMSE averaged over ``splits``."""
    recs = [by_split[k] for k in sorted(splits)]
    figures = {k: sum(r["figures"][k] for r in recs) / len(recs) for k in ("test_loglik", "rmse")}
    return {**recs[-1], "figures": {**figures, "splits": len(recs)}}


def _sghmc_reached(dataset: str, loglik: float) -> bool:
    sghmc = LINDINGER.get(dataset)
    return sghmc is not None and loglik >= float(sghmc[0].split()[0])


def atlas_goal_rows(records: list[dict]) -> list[dict]:
    """One row per set: the best atlas row (test log-lik), the best single MeanField fit and
    the best row richer than one MeanField fit, against Lindinger et al. 2020's SGHMC DGP;
    then a row counting the sets where the best reaches SGHMC and where a richer row is best.

    Each set's rows come from one protocol: the runs with a held-out tenth (``validation``)
    where the set has any, else the runs on the whole training split. Rows are compared by
    their means over the same splits (:func:`_common_splits`); a row without one of them is
    left out."""
    rows, reached, richer = [], 0, 0
    for dataset, labels in sorted(_per_split(records).items(), key=lambda kv: _rank(kv[0])):
        labels = {k: v for k, v in labels.items()
                  if _counts(dataset, next(iter(v.values())))}
        held_out = {k: v for k, v in labels.items() if k[2]}
        labels = held_out or labels
        if not labels:
            continue
        splits = _common_splits(labels)
        recs = [_over_splits(v, splits) for v in labels.values() if splits <= set(v)]
        key = lambda r: r["figures"]["test_loglik"]  # noqa: E731
        best = max(recs, key=key)
        mf = [r for r in recs if r["settings"]["guide"] == "meanfield"]
        rich = [r for r in recs if r["settings"]["guide"] != "meanfield"]
        best_rich = max(rich, key=key) if rich else None
        sghmc = LINDINGER.get(dataset)
        hit = _sghmc_reached(dataset, best["figures"]["test_loglik"])
        # without a MeanField row to beat (say, only its alpha = 1 fit, left out) no count
        rich_best = bool(mf) and best["settings"]["guide"] != "meanfield"
        reached, richer = reached + hit, richer + rich_best
        rows.append({**_latest(recs), "settings": {
            "rank": _rank(dataset), "dataset": dataset, "splits": len(splits),
            "protocol": "validation" if held_out else "full"},
            "figures": {"best": f"{best['settings']['guide']} ({best['settings']['objective']})",
                        "best_cell": _row_cell(best),
                        "meanfield": _row_cell(max(mf, key=key) if mf else None),
                        "richer": "" if best_rich is None else
                        f"{best_rich['settings']['guide']}: {_row_cell(best_rich)}",
                        "sghmc": "" if sghmc is None else sghmc[0], "reached": hit,
                        "goal": f"{'yes' if hit else 'no'}; "
                                f"{('yes' if rich_best else 'no') if mf else '—'}"}})
    if rows:
        rows.append(_goal_row(records, rows[0], f"{reached}; {richer}"))
    return rows


def _goal_row(records: list[dict], like: dict, goal: str) -> dict:
    """The last row of a goal table: empty cells where ``like`` (a set's row) has settings
    and figures, the count of sets reached ``goal`` beside the number of Lindinger's sets."""
    return {**_latest(records),
            "settings": {**{k: "" for k in like["settings"]}, "rank": len(SET_ORDER) + 1,
                         "dataset": "goal"},
            "figures": {**{k: "" for k in like["figures"]}, "reached": False,
                        "sghmc": f"of {len(LINDINGER)} sets", "goal": goal}}


def summary_splits(rec: dict) -> tuple[int, ...] | None:
    """The splits a defaults-study summary covers: its ``splits_run`` list, or, where that is
    a count (the stack's summaries before they listed their splits), the ``--splits`` of its
    command when there are as many; ``None`` when unknown."""
    run = rec["figures"].get("splits_run")
    if isinstance(run, list):
        return tuple(run)
    words = str(rec.get("command") or "").split()
    if "--splits" not in words:
        return None
    given = []
    for word in words[words.index("--splits") + 1:]:
        if not word.isdigit():
            break
        given.append(int(word))
    return tuple(given) if len(given) == run else None


def budget_goal_rows(records: list[dict], atlas: list[dict] | None = None) -> list[dict]:
    """The defaults study's runs at budgets other than the atlas's 3,000 steps, one row per
    (set of Lindinger et al. 2020's, steps): its best single fit and its held-out stack beside
    the atlas's best row (``atlas``: the guide atlas's records, :func:`atlas_goal_rows`),
    against SGHMC DGP's best over L; then a row counting the sets reached at these budgets and
    at either budget, the atlas's included.

    Per set and budget, the configurations (objective, schedule) are compared over the
    largest set of splits that any of its single fits has covered, each with its latest
    summary over exactly those splits (:func:`_splits_run`). On
    :data:`INTEGER_TARGETS` only the ELBO fits count (no alpha = 1 fit, no stack of one)."""
    at_atlas = {r["settings"]["dataset"]: r["figures"] for r in atlas_goal_rows(atlas or [])
                if r["settings"]["dataset"] in LINDINGER}
    latest: dict[tuple, dict] = {}
    for rec in sorted(records, key=lambda r: str(r.get("date") or "")):
        s = rec["settings"]
        if (s.get("steps") != 3000 and s.get("validation") and s["dataset"] in LINDINGER
                and (s["dataset"] not in INTEGER_TARGETS or s["objective"] in ("auto", "auto,P=10"))
                and summary_splits(rec)):
            latest[(s["dataset"], s["steps"], s["guide"], s["objective"], s.get("lr_schedule"),
                    summary_splits(rec))] = rec
    groups: dict[tuple, list[dict]] = {}
    for key, rec in latest.items():
        groups.setdefault(key[:2], []).append(rec)
    rows, reached = [], set()
    for (dataset, steps), recs in sorted(groups.items(), key=lambda kv: (_rank(kv[0][0]),
                                                                         kv[0][1])):
        covered = [summary_splits(r) for r in recs if r["settings"]["objective"] != "stack"]
        most = max(covered, key=lambda sp: (len(sp), covered.count(sp)), default=())
        recs = [r for r in recs if summary_splits(r) == most]
        if not recs:
            continue
        fits = [r for r in recs if r["settings"]["objective"] != "stack"]
        stack = next((r for r in recs if r["settings"]["objective"] == "stack"), None)
        key = lambda r: r["figures"]["test_loglik"]  # noqa: E731
        best = max(fits, key=key) if fits else None
        hit = _sghmc_reached(dataset, key(max(recs, key=key)))
        if hit:
            reached.add(dataset)
        label = None if best is None else best["settings"]["guide"] + ", " + best[
            "settings"]["objective"] + (f", {best['settings']['lr_schedule']}"
                                        if best["settings"].get("lr_schedule") else "")
        atlas_row = at_atlas.get(dataset, {})
        rows.append({**_latest(recs), "settings": {
            "rank": _rank(dataset), "dataset": dataset, "splits": len(most), "steps": steps},
            "figures": {"best": label or "", "best_cell": _row_cell(best),
                        "stack": _row_cell(stack), "atlas": atlas_row.get("best_cell", ""),
                        "sghmc": LINDINGER[dataset][0], "goal": "yes" if hit else "no"}})
    if rows:
        either = reached | {d for d, f in at_atlas.items() if f.get("reached")}
        rows.append(_goal_row(records, rows[0],
                              f"{len(reached)}; {len(either)} at either budget"))
    return rows


#: the peers of the kernel-layout table (``peers.py`` names) and their columns
KERNEL_PEERS = {"ours": "one kernel per layer", "ours-per-output": "a kernel per hidden GP",
                "deepgp": "GPyTorch DeepGP"}
#: the settings every peer of one row shares (runs of other settings get rows of their own)
_KERNEL_RUN = ("steps", "batch", "inducing", "layers", "dtype", "seed")


def _kernel_cell(recs: list[dict]) -> str:
    ll = sum(r["figures"]["test_loglik"] for r in recs) / len(recs)
    rmse = sum(r["figures"]["rmse"] for r in recs) / len(recs)
    return f"{ll:.3f} / {rmse:.3g}"


def kernel_rows(records: list[dict]) -> list[dict]:
    """One row per set: each of :data:`KERNEL_PEERS`' mean test log-lik / RMSE over the
    splits both of ours have run at ``fit``'s current settings (``particles`` recorded;
    GPyTorch's where it has them all), which layout is ahead in mean log-lik and on how many
    of those splits, and a last row counting the sets each layout leads."""
    by_set: dict[tuple, dict[str, dict[int, dict]]] = {}
    for rec in records:
        s = rec["settings"]
        if s.get("peer") not in KERNEL_PEERS or (s["peer"] != "deepgp" and "particles" not in s):
            continue
        key = (s["dataset"], *(s.get(k) for k in _KERNEL_RUN))
        by_set.setdefault(key, {}).setdefault(s["peer"], {})[s["split"]] = rec
    rows, leads = [], {"ours": 0, "ours-per-output": 0}
    for key in sorted(by_set, key=lambda k: (_rank(k[0]), str(k))):
        (dataset, *run), peers = key, by_set[key]
        splits = sorted(set(peers.get("ours", {})) & set(peers.get("ours-per-output", {})))
        if not splits:
            continue
        chosen = {p: [peers[p][k] for k in splits] for p in KERNEL_PEERS
                  if set(splits) <= set(peers.get(p, {}))}
        ll = {p: [r["figures"]["test_loglik"] for r in chosen[p]] for p in leads}
        lead = max(leads, key=lambda p: sum(ll[p]))
        other = "ours" if lead == "ours-per-output" else "ours-per-output"
        leads[lead] += 1
        ahead = sum(a > b for a, b in zip(ll[lead], ll[other], strict=True))
        rows.append({**_latest(chosen["ours"] + chosen["ours-per-output"]), "settings": {
            "rank": _rank(dataset), "dataset": dataset, "splits": len(splits),
            **dict(zip(_KERNEL_RUN, run, strict=True))},
            "figures": {**{p: _kernel_cell(chosen[p]) if p in chosen else "—"
                           for p in KERNEL_PEERS},
                        "ahead": f"{KERNEL_PEERS[lead]}, {ahead} of {len(splits)}"}})
    if rows:
        shared = {k: rows[0]["settings"][k] for k in _KERNEL_RUN
                  if len({r["settings"][k] for r in rows}) == 1}
        rows.append({**_latest(records), "settings": {"rank": len(SET_ORDER) + 1,
                                                      "dataset": "sets led", "splits": "",
                                                      **shared},
                     "figures": {**{p: str(leads.get(p, "")) for p in KERNEL_PEERS},
                                 "ahead": "sets each layout leads in mean log-lik"}})
    return rows
