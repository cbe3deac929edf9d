"""What freezing costs, measured by the profiler: each group's share of the probe loss's change
(conserved: the shares add up to the change), the branch runs, and the `measured` sensitivity and
time-to-quality solve that read them — in a real 2-rank pipelined run, 1F1B and a V schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from freezeopt.formats.profile import load_profile
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.profiling.loss_cost import branch_count, branch_frozen, conservation
from freezeopt.profiling.run import format_report, profile_job
from freezeopt.solver import SolveOptions, solve_ttq
from tests.profiling.test_run import small_job

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "shape",
    [{}, {"schedule": "ZBVZeroBubble", "stages_per_rank": 2}],
    ids=["1F1B", "ZBVZeroBubble"],
)
def test_the_groups_shares_add_up_to_the_probe_losss_change(tmp_path: Path, shape: dict) -> None:
    job = small_job(measure_steps=4, branch_steps=3, **shape)
    rep = profile_job(job, out=tmp_path / "p.json", progress=False)
    p = load_profile(tmp_path / "p.json")
    # the report checks the measurement both ways, and says so
    lc = rep.loss_cost
    assert lc is not None and lc["steps"] == job.measure_steps
    assert lc["conservation_r2"] is None or lc["conservation_r2"] > 0.95
    assert 0 < lc["branch"]["kept_predicted"] <= 1 and lc["branch"]["frozen_share"] == 0.25
    text = format_report(rep)
    assert "loss cost: probe loss" in text and "branch runs (3 steps" in text
    assert p.probe is not None and p.probe.batches == job.probe_batches
    assert len(p.probe.loss) == job.measure_steps + 1
    changes = [b - a for a, b in zip(p.probe.loss, p.probe.loss[1:], strict=False)]
    allocated = [sum(t.loss_change[i] for t in p.gradients) for i in range(job.measure_steps)]
    assert all(len(t.loss_change) == job.measure_steps for t in p.gradients)
    for c, a in zip(changes, allocated, strict=True):
        assert a == pytest.approx(c, rel=0.05, abs=1e-4)  # second-order exact per step
    r2 = conservation(changes, allocated)
    assert r2 is None or r2 > 0.95
    assert sum(changes) < 0  # training lowered the held-out loss
    br = p.probe.branch
    assert br is not None and br.steps == 3 and br.frozen_share == 0.25  # 1 of 4 microbatches
    assert br.loss_start == pytest.approx(p.probe.loss[-1], rel=1e-6)  # from the state measured
    assert br.loss_full < br.loss_start and br.loss_frozen < br.loss_start
    # the profile solves with the measured sensitivity, and with the time-to-quality objective
    sig = estimate_signal(p, "measured")
    assert sum(g.share for row in sig for g in row) == pytest.approx(1.0)
    r = solve_ttq(
        build_dag(p),
        sig,
        SolveOptions(objective="ttq", sensitivity="measured", budget=0.2, time_limit=20),
    )
    assert r.time_to_quality is not None and (r.status == "no_gain") == (not r.frozen)


def test_probe_batches_0_measures_nothing_and_says_what_to_do(tmp_path: Path) -> None:
    from freezeopt.errors import InputError

    profile_job(small_job(probe_batches=0), out=tmp_path / "p.json", progress=False)
    p = load_profile(tmp_path / "p.json")
    assert p.probe is None and all(not t.loss_change for t in p.gradients)
    with pytest.raises(InputError, match="probe_batches > 0"):
        estimate_signal(p, "measured")


def test_branch_draws_are_the_same_on_every_rank_and_of_the_right_size() -> None:
    for m in (2, 4, 8, 16, 64):
        k = branch_count(m)
        assert 1 <= k < m
        for step in range(3):
            a = branch_frozen(step, 1, 2, m)
            assert a == branch_frozen(step, 1, 2, m) and len(a) == k and max(a) < m
    assert branch_frozen(0, 0, 0, 16) != branch_frozen(1, 0, 0, 16)  # drawn anew each step


def test_conservation() -> None:
    assert conservation([-1.0, -0.5, -0.2], [-1.0, -0.5, -0.2]) == pytest.approx(1.0)
    assert conservation([-1.0, -0.5, -0.2], [-0.2, -1.0, -0.5]) < 0
    assert conservation([-1.0], [-1.0]) is None and conservation([0.1, 0.1], [0.0, 0.0]) is None
