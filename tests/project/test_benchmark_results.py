"""Benchmark results as JSON lines (benchmarks/results.py), and BENCHMARKS.md generated from
them (benchmarks/report.py)."""

import json
import re
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts are not an installed package

import report  # noqa: E402
import results  # noqa: E402

FIELDS = {"benchmark", "command", "machine", "date", "session", "commit", "dirty", "settings",
          "figures"}


def test_record_appends_one_line_per_call_and_reads_back(tmp_path):
    first = results.record("toy", {"n": 1}, {"ms": 2.5}, command="python benchmarks/toy.py --n 1",
                           results_dir=tmp_path)
    results.record("toy", {"n": 2}, {"ms": {"ours": 3.5}}, command=["python", "toy.py", "a b"],
                   results_dir=tmp_path)
    lines = (tmp_path / "toy.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == first
    assert FIELDS <= set(first)
    assert first["benchmark"] == "toy" and first["session"] is None
    assert first["machine"]["cores"] and first["machine"]["host"] is not None
    assert {"arch", "cpu", "python"} <= set(first["machine"])
    # the versions a timing depends on (pyro is a dependency, so always there)
    from importlib.metadata import version

    assert first["machine"]["pyro"] == version("pyro-ppl")
    assert first["machine"]["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", first["date"])
    assert first["dirty"] in (True, False, None)
    back = results.read("toy", tmp_path)
    assert [r["settings"]["n"] for r in back] == [1, 2]
    assert back[1]["figures"] == {"ms": {"ours": 3.5}}
    assert back[1]["command"] == "python toy.py 'a b'"
    assert results.read("absent", tmp_path) == []


def test_record_defaults_to_this_command_line_and_the_environment_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["benchmarks/toy.py", "--steps", "3"])
    rec = results.record("toy", {"n": 1}, {"ms": 1.0})
    assert rec["command"].startswith("python ") and rec["command"].endswith("toy.py --steps 3")
    assert results.read("toy") == [rec]


def _write(directory: Path, name: str, records: list[dict]) -> None:
    with open(directory / f"{name}.jsonl", "a") as fh:
        for rec in records:
            fh.write(json.dumps({"benchmark": name, "machine": None, "commit": None, **rec}) + "\n")


def test_report_shows_the_latest_record_of_each_configuration(tmp_path):
    for n, ms in ((1, 9.0), (1, 2.0), (2, 7.0)):
        results.record("toy", {"n": n}, {"ms": ms}, results_dir=tmp_path,
                       command=f"python benchmarks/uci.py --steps {n} --note {ms}")
    out = tmp_path / "BENCHMARKS.md"
    args = ["--output", str(out), "--results-dir", str(tmp_path)]
    assert report.main(args) == 0
    text = out.read_text()
    assert "| n 1 | 2.0 |" in text and "| n 2 | 7.0 |" in text and "| 9.0 |" not in text
    assert "`python benchmarks/uci.py --steps 1 --note 2.0`" in text
    assert "--note 9.0" not in text
    assert "history.md" in text and "report.py" in text


def test_latest_is_by_date_then_session_then_file_order(tmp_path):
    _write(tmp_path, "toy", [
        {"date": "2026-01-02", "session": 1, "settings": {"n": 1}, "figures": {"ms": 1.5},
         "command": "a"},
        {"date": "2026-01-01", "session": 9, "settings": {"n": 1}, "figures": {"ms": 2.5},
         "command": "b"},
        {"date": "2026-01-01", "session": 3, "settings": {"n": 2}, "figures": {"ms": 3.5},
         "command": "c"},
        {"date": "2026-01-01", "session": 2, "settings": {"n": 2}, "figures": {"ms": 4.5},
         "command": "d"},
    ])
    latest = report.latest_per_configuration(results.read("toy", tmp_path))
    assert sorted(r["command"] for r in latest) == ["a", "c"]


def test_check_detects_a_stale_file(tmp_path):
    results.record("toy", {"n": 1}, {"ms": 2.0}, command="first", results_dir=tmp_path)
    out = tmp_path / "BENCHMARKS.md"
    args = ["--output", str(out), "--results-dir", str(tmp_path)]
    assert report.main([*args, "--check"]) == 1  # not written yet
    assert report.main(args) == 0
    assert report.main([*args, "--check"]) == 0
    results.record("toy", {"n": 1}, {"ms": 1.0}, command="second", results_dir=tmp_path)
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert report.main([*args, "--check"]) == 1


def test_published_figures_stand_in_their_own_column(tmp_path):
    settings = {"dataset": "boston", "model": "DGP 2", "guide": "meanfield", "steps": 10}
    results.record("uci", settings, {"splits": 1, "test_loglik": -2.2, "rmse": 3.0},
                   command="python benchmarks/uci.py --datasets boston", results_dir=tmp_path)
    text = report.render(tmp_path)
    assert "| published log-lik |" in text and report.SALIMBENI in text
    assert "| boston, DGP 2 | 10 | 1 | -2.2 | -2.47 (0.05) | 3.0 | 2.90 (0.17) | [1] |" in text


def test_records_copied_from_the_log_point_at_their_figures():
    lines = (RESULTS / "history.md").read_text().splitlines()
    copied = [r for path in sorted(RESULTS.glob("*.jsonl"))
              for r in results.read(path.stem, RESULTS) if r.get("source") == "history.md"]
    assert copied
    for rec in copied:
        assert FIELDS <= set(rec)
        line = lines[rec["source_line"] - 1]
        numbers = {float(t) for t in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", line)}
        values = [v for v in report.flatten(rec["figures"]).values() if isinstance(v, float)]
        assert any(v in numbers for v in values), (rec["source_line"], rec["settings"])


def test_benchmarks_md_is_generated_from_the_recorded_results():
    assert report.main(["--check", "--results-dir", str(RESULTS)]) == 0, (
        "BENCHMARKS.md is stale: run python benchmarks/report.py")


def _rec(command: str, **fields) -> dict:
    return {"command": command, "commit": "abc1234", "settings": {}, "figures": {}, **fields}


def test_a_command_runs_from_the_repository_root_or_the_record_goes_to_history():
    run = report.runnable_command
    assert run(_rec("python uci.py --steps 3 --out /tmp/a.jsonl --checkpoint-dir /tmp/c")) == (
        "python benchmarks/uci.py --steps 3", "")
    assert run(_rec("python benchmarks/uci.py --out out/a.jsonl"))[0] == (
        "python benchmarks/uci.py --out out/a.jsonl")
    assert run(_rec("python benchmarks/uci.py --families 'a b'"))[0] == (
        "python benchmarks/uci.py --families 'a b'")
    for rec, reason in [
            (_rec("python out/s4/decompose.py x"), "not in the repository"),
            (_rec("python benchmarks/uci.py --steps 3", commit=None), "no commit"),
            (_rec(None), "no command"),
            (_rec("python benchmarks/uci.py --steps 3", note="merged runs"), "note"),
            (_rec("python benchmarks/compositional.py --trials 5 ... (out/s3/x)"), "elided"),
            (_rec("python benchmarks/uci.py --config /work/x.json"), "outside the repository"),
            (_rec("python benchmarks/uci.py --config ../x.json"), "outside the repository")]:
        command, why = run(rec)
        assert command is None and reason in why, (rec, why)


def test_a_record_without_a_runnable_command_is_listed_in_history_not_in_the_tables(tmp_path):
    (tmp_path / "history.md").write_text("# The hand-written log\n\nkept as written\n")
    rows = [_rec("python benchmarks/speed.py --threads 1", settings={"n": 1},
                 figures={"ms": 1.5}, date="2026-01-01"),
            _rec("python scratch.py", settings={"n": 2}, figures={"ms": 2.5},
                 date="2026-01-01", note="a scratch script")]
    _write(tmp_path, "toy", rows)
    out = tmp_path / "BENCHMARKS.md"
    assert report.main(["--output", str(out), "--results-dir", str(tmp_path)]) == 0
    assert "| 1.5 | [1] |" in out.read_text() and "2.5" not in out.read_text()
    history = (tmp_path / "history.md").read_text()
    assert history.startswith("# The hand-written log\n\nkept as written\n")
    assert "ms 2.5" in history and "Note: a scratch script" in history and "ms 1.5" not in history
    assert report.main(["--output", str(out), "--results-dir", str(tmp_path), "--check"]) == 0
    (tmp_path / "history.md").write_text(history + "edited\n")  # a stale history fails too
    assert report.main(["--output", str(out), "--results-dir", str(tmp_path), "--check"]) == 1


def layout_problems(text: str) -> list[str]:
    """What breaks the page's layout: a table wider than 8 columns, a row whose run is not a
    command from the repository root (``python benchmarks/...``, no path outside it), a row
    dated by a period of work ("(session N)", "(log)")."""
    problems = []
    runs = dict(re.findall(r"^- \[(\d+)\] `([^`]*)`", text, flags=re.M))
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) > report.MAX_COLUMNS:
            problems.append(f"{len(cells)} columns: {line[:60]}")
        if re.search(r"\((session \d+|log)\)", line):
            problems.append(f"dated by a period of work: {line[:60]}")
        if cells[-1] in ("run", "run |"):
            continue
        number = re.fullmatch(r"\[(\d+)\]", cells[-1])
        command = runs.get(number.group(1)) if number else None
        if (command is None or not command.startswith("python benchmarks/")
                or any(t.startswith(("/", "~")) or ".." in t for t in shlex.split(command))):
            problems.append(f"run not from the repository: {line[:60]} -> {command}")
    return problems


def test_benchmarks_md_has_short_tables_and_rows_that_rerun_from_the_repository():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert "| run |" in text
    assert layout_problems(text) == []
    assert layout_problems("| a | b | c | d | e | f | g | h | i |\n") != []
    assert layout_problems("| x (session 3) | [1] |\n- [1] `python benchmarks/uci.py`") != []
    assert layout_problems("| x | [1] |\n- [1] `python out/s4/decompose.py`") != []
    assert layout_problems("| x | [1] |\n- [1] `python benchmarks/uci.py --out /tmp/a`") != []
