"""`freezeopt compare` on a tiny real job: every policy runs, and the report files exist and parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freezeopt.compare import CompareOptions, compare_job
from freezeopt.job import load_job, replace_job

pytestmark = pytest.mark.slow


def test_compare_tiny(tmp_path: Path) -> None:
    job = replace_job(
        load_job("tiny-gpt"),
        measure_steps=4,
        warmup_steps=1,
        cost_samples=3,
        lag_samples=5,
        val_batches=1,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        data_args={"max_train_bytes": 100000, "max_val_bytes": 10000, "val_every": 10},
    )
    opts = CompareOptions(
        policies=(
            "none",
            "uniform",
            "timelyfreeze",
            "stability",
            "freezeopt",
            "freezeopt-heuristic",
        ),
        steps=14,
        warmup_steps=3,
        val_every=5,
        budget=0.2,
        sweep=(0.1,),
        time_limit=20,
    )
    rep = compare_job(job, out_dir=tmp_path / "cmp", opts=opts, progress=False)
    assert [r.policy for r in rep.results] == list(opts.policies)
    none = rep.results[0]
    assert none.ratio == pytest.approx(1.0) and none.gain_captured is None
    for r in rep.results:
        assert r.step_ms > 0 and r.val_loss > 0 and r.loss > 0
    out = tmp_path / "cmp"
    assert (out / "report.md").read_text().startswith("# freezeopt compare")
    data = json.loads((out / "results.json").read_text())
    swept = [p for p in opts.policies if p not in ("none", "timelyfreeze")]
    assert len(data["runs"]) == len(opts.policies) and len(data["sweep"]) == len(swept)
    for png in ("loss_vs_time.png", "budget_sweep.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert len(list((out / "schedules").glob("*.yaml"))) == len(opts.policies) + len(swept)
