"""``benchmarks/toys.py`` end to end at a tiny size: the gold standard's record (its rising
share exactly one half, by the reflection) and one record per guide, and its report section."""

import math
import re

import pytest
import report
import results
import toys as bench

GUIDES = ["meanfield", "coupled", "chain", "mixture", "ssivi-tril-init", "mixture-fits-start",
          "mixture-fits", "mixture-modes", "stack-fits", "meanfield-seed1"]


@pytest.mark.slow
def test_the_symmetric_toy_records_the_gold_and_each_guide(monkeypatch, tmp_path):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    argv = ["--toys", "symmetric", "--steps", "3", "--mixture-steps", "2", "--fits", "2",
            "--samples", "8", "--elbo-particles", "2", "--grid", "4", "--nuts-chains", "1",
            "--nuts-warmup", "3", "--nuts-samples", "4", "--max-tree-depth", "3",
            "--is-draws", "50000"]
    assert bench.main(argv) == 0
    recs = results.read("toys", tmp_path)
    assert [r["settings"]["guide"] for r in recs] == ["gold"] + GUIDES
    gold, *guides = recs
    # each symmetrised chain is matched by its mirror image: exactly half rise
    assert gold["figures"]["share_rising"] == 0.5
    assert abs(gold["figures"]["mass_rising"] - 0.5) < 4 * gold["figures"]["mass_rising_se"]
    for rec in guides:
        f = rec["figures"]
        assert 0 <= f["share_rising"] <= 1
        assert all(math.isfinite(f[k]) and f[k] >= 0 for k in ("w1", "w1_layer1")), f
        assert isinstance(f["goal_shares"], bool) and isinstance(f["goal_w1"], bool)
    weights = {r["settings"]["guide"]: r["figures"].get("weights") for r in guides}
    assert len(weights["mixture-fits"]) == 2 and len(weights["stack-fits"]) == 2
    text = "\n".join(report.section_lines(report.TOYS_SECTION, recs, []))
    assert "## Guides against the posterior on the toys" in text
    assert re.search(r"\| symmetric, gold[^|]*\| 0\.5; IS mass 0\.\d+ \(0\.\d+\) \|", text), text
