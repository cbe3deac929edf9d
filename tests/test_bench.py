"""`benchmarks/bench_solver.py --quick` runs end to end and writes every table (no timing checks)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_solver.py"


@pytest.mark.bench
def test_quick_bench_writes_all_tables(tmp_path: Path) -> None:
    out = tmp_path / "solver.md"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == ""  # progress goes to stderr, the report to the file
    text = out.read_text()
    for heading in (
        "# Solver benchmarks",
        "## 1. Exact `lp`, side by side",
        "## 2. `milp` and `heuristic`",
        "### `milp`",
        "### `heuristic`",
        "## 3. TimelyFreeze's dense LP",
        "## 4. Targets",
    ):
        assert heading in text, heading
    for header in (
        "| schedule | stages×mb | groups | actions | method | build s | solve s | total s | pivots |",
        "| size | groups | solver | status | seconds | predicted ms | LP bound ms |",
        "| size | actions | dense matrix GiB | dense build+solve s | dense peak RSS MB |",
        "| target | method | measured | verdict |",
    ):
        assert header in text, header
    for line in ("| machine | nproc", "| versions | python", "| command | `", "| load average"):
        assert line in text, line

    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    # lp at 8×64: three schedules × (arrays, warm re-solve, heuristic, heuristic with a 2 s limit,
    # PuLP+HiGHS, PuLP+CBC), all solved; the PuLP LPs and the warm re-solve agree with the
    # array-built LP.
    lp_rows = [
        ln
        for ln in rows
        if ln.startswith(("| 1F1B | 8×64 |", "| Interleaved1F1B | 8×64 |", "| ZBV | 8×64 |"))
    ]
    assert len(lp_rows) == 18, lp_rows
    assert sum("| heuristic, 2 s limit |" in ln and "; own " in ln for ln in lp_rows) == 3
    assert not any("error" in ln or "timeout" in ln or "not run" in ln for ln in lp_rows), lp_rows
    for ln in lp_rows:
        if "PuLP" in ln or "warm" in ln:
            deltas = [float(x) for x in re.findall(r"Δ\w+ ([0-9.e+-]+)", ln)]
            assert len(deltas) == 2 and max(deltas) < 1e-4, ln
    # milp 4×8 with 4 and 8 groups on both solvers, plus two heuristic rows.
    milp_rows = [ln for ln in rows if ln.startswith("| 4×8 |")]
    assert len(milp_rows) == 6
    assert not any("error" in ln or "timeout" in ln for ln in milp_rows), milp_rows
    # The dense and sparse LPs agree at 8×64.
    dense_rows = [ln for ln in rows if ln.startswith("| 8×64 | 1024 |")]
    assert len(dense_rows) == 1 and "| yes (" in dense_rows[0], dense_rows
