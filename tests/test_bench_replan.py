"""`benchmarks/bench_replan.py` runs end to end on a short setting and writes its table (no timing checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_replan.py"


def _bench(script: str, *args: str, timeout: float) -> None:
    """Run `benchmarks/<script>` from the repo root; it must exit 0."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.bench
def test_short_replan_bench_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "replan.md"
    args = ["--rounds", "1", "--steps", "10", "--slow-from", "4", "--replan-every", "3"]
    _bench(SCRIPT.name, *args, "--work", str(tmp_path / "w"), "--out", str(out), timeout=900)
    text = out.read_text()
    assert "Command: `python benchmarks/bench_replan.py --rounds 1 --steps 10" in text
    assert "| kept | " in text and "| replan | " in text
    assert "| 0 | kept | " in text and "| 0 | replan | " in text
    # the replan arm re-planned after step 5 (3 measured steps from step 3, (5 + 1) % 3 == 0)
    assert "- replan-0 step " in text and "triggered after step 5)" in text
    assert "- kept-0 step" not in text  # the kept arm never re-plans
    assert (tmp_path / "w" / "replan-0" / "replans").is_dir()
    assert not (tmp_path / "w" / "kept-0" / "replans").exists()


def test_replan_scale_bench_writes_its_table(tmp_path: Path) -> None:
    """`benchmarks/bench_replan_scale.py` on tiny cases: warm re-plans after the first, warm
    and cold LP bounds agree in every row, and the short-limit arm's plans are no faster than
    that bound."""
    out = tmp_path / "scale.md"
    args = ["--cases", "1F1B:4x8,ZBVZeroBubble:4x8", "--replans", "3", "--out", str(out)]
    _bench("bench_replan_scale.py", *args, timeout=600)
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| 1F1B")]
    rows += [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| ZBV")]
    assert len(rows) == 6
    for cells in rows:
        warm_bound, cold_bound = cells[8].split(" / ")
        assert float(warm_bound) == pytest.approx(float(cold_bound), rel=1e-6)
        seconds, plan, status = cells[9].rstrip(" |").split(", ")
        assert float(seconds) > 0 and status in {"heuristic", "heuristic_fallback"}
        assert float(plan.split(" (")[0]) >= float(warm_bound) * (1 - 1e-6)
    assert [c[6] for c in rows] == ["no", "yes", "yes"] * 2
    assert "With a 2 s limit (every re-plan):" in out.read_text()


@pytest.mark.bench
def test_overlap_bench_writes_its_table(tmp_path: Path) -> None:
    """`benchmarks/bench_overlap.py` on a tiny re-plan: the three loops and the solve's seconds
    (no timing checks)."""
    out = tmp_path / "overlap.md"
    _bench("bench_overlap.py", "--size", "4x8", "--out", str(out), timeout=600)
    text = out.read_text()
    assert "| command | `python benchmarks/bench_overlap.py --size 4x8" in text
    rows = [
        line for line in text.splitlines() if line.startswith("| alone") or "re-plan in" in line
    ]
    assert len(rows) == 3 and rows[0].endswith("| — |")
    assert all(float(r.split("|")[-2]) >= 0 for r in rows[1:])  # each re-plan reports its seconds
