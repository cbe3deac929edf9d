"""`benchmarks/bench_cost_over_training.py` read back from its committed profiles: the figures of
one profile, and the report rebuilt byte for byte (the training and profiling it runs first are
`make bench`'s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_cost_over_training as mod

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "benchmarks" / "cost-over-training"


def test_one_profiles_figures() -> None:
    from freezeopt.formats.profile import load_profile

    r = mod.point(load_profile(FOLDER / "profile-150.json"), 150)
    assert r["step"] == 150 and r["batch"] == 16
    assert len(r["noise_scale"]) == 8 and all(b > 0 for b in r["noise_scale"].values())
    # the noise scale grew from the step-0 profile's, and the same plan costs more on it
    r0 = mod.point(load_profile(FOLDER / "profile-0.json"), 0)
    assert r["noise_scale_median"] > 2 * r0["noise_scale_median"]
    assert 0 < r0["plan_lost_gns"] < r["plan_lost_gns"] < 1
    assert 0 <= r["resolved_frozen_share"] <= 1


@pytest.mark.slow
def test_the_report_rebuilds_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "cot.md"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_cost_over_training.py")]
    done = subprocess.run(
        [*cmd, "--report-only", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text() == (ROOT / "benchmarks" / "cost_over_training.md").read_text()
    got = json.loads(out.with_suffix(".json").read_text())
    assert got == json.loads((ROOT / "benchmarks" / "cost_over_training.json").read_text())
