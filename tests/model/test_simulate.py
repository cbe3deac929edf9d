"""The simulator against hand-computed timelines."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from freezeopt.actions import Action
from freezeopt.formats.profile import (
    ActionCost,
    GroupProfile,
    Lag,
    Pipeline,
    Profile,
    Provenance,
    RankProfile,
    StageProfile,
    Stat,
)
from freezeopt.model.dag import build_dag
from freezeopt.model.simulate import Timer, simulate
from tests.conftest import make_profile


def _stat(x: float) -> Stat:
    return Stat(median=x, p10=x, p90=x, n=1)


def hand_profile(lag: float = 0.0) -> Profile:
    """GPipe, 2 stages on 2 ranks, 2 microbatches. F = 1 ms, B = 2 ms (1 ms of it weight grads)."""
    ranks = (
        RankProfile(rank=0, actions=("0F0", "0F1", "0B0", "0B1")),
        RankProfile(rank=1, actions=("1F0", "1F1", "1B0", "1B1")),
    )
    costs = tuple(
        ActionCost(action=a, cost_ms=_stat(1.0 if "F" in a else 2.0))
        for r in ranks
        for a in r.actions
    )
    stages = tuple(
        StageProfile(
            stage=s,
            rank=s,
            groups=(GroupProfile(name="g", params=("w",), numel=1, weight_grad_ms=_stat(1.0)),),
        )
        for s in range(2)
    )
    lags = (
        Lag(src_stage=0, dst_stage=1, kind="F", ms=_stat(lag)),
        Lag(src_stage=1, dst_stage=0, kind="B", ms=_stat(lag)),
    )
    return Profile(
        schema_version=1,
        provenance=Provenance(source="synth", freezeopt="test", python="3"),
        pipeline=Pipeline(schedule="GPipe", world_size=2, n_stages=2, n_microbatches=2),
        ranks=ranks,
        actions=costs,
        stages=stages,
        lags=lags,
    )


def test_hand_computed_timeline() -> None:
    # rank0: 0F0 [0,1] 0F1 [1,2]; rank1: 1F0 [1,2] 1F1 [2,3] 1B0 [3,5] 1B1 [5,7];
    # rank0: 0B0 waits for 1B0 -> [5,7], 0B1 waits for 1B1 and 0B0 (both end at 7) -> [7,9]
    dag = build_dag(hand_profile())
    tl = simulate(dag)
    want = {"0F0": 0, "0F1": 1, "1F0": 1, "1F1": 2, "1B0": 3, "1B1": 5, "0B0": 5, "0B1": 7}
    assert {str(a): s for a, s in tl.start.items()} == pytest.approx(want)
    assert tl.makespan == pytest.approx(9.0)
    path = tl.critical_path
    assert [str(a) for a in path[:4]] == ["0F0", "1F0", "1F1", "1B0"]
    assert str(path[-1]) == "0B1" and str(path[-2]) in ("0B0", "1B1")
    for u, v in itertools.pairwise(path):  # a chain of tight edges
        assert dag.graph.has_edge(u, v)
        assert tl.end[u] + dag.graph.edges[u, v]["lag"] == pytest.approx(tl.start[v])


def test_lags_delay_cross_rank_edges_only() -> None:
    dag = build_dag(hand_profile(lag=0.5))
    tl = simulate(dag)
    # 1F0 at 1.5, 1F1 at max(2.5, 2.5)=2.5, 1B0 at 3.5-5.5, 1B1 5.5-7.5, 0B0 at 6.0-8.0, 0B1 at 8.0-10.0
    assert tl.start[Action(1, "F", 0)] == pytest.approx(1.5)
    assert tl.makespan == pytest.approx(10.0)


def test_freezing_off_the_critical_path_saves_nothing() -> None:
    dag = build_dag(hand_profile())
    base = simulate(dag).makespan
    # 0B1 waits for both 0B0 and 1B1: shortening one of them alone saves nothing,
    # shortening 1B0 (which both wait for) saves its full 1 ms
    off = simulate(dag, dag.durations({(Action(0, "B", 0), 0): 1.0})).makespan
    on = simulate(dag, dag.durations({(Action(1, "B", 0), 0): 1.0})).makespan
    assert off == pytest.approx(base)
    assert on == pytest.approx(base - 1.0)


def test_all_frozen_floor() -> None:
    dag = build_dag(hand_profile())
    # every B is 1 ms: 1B0 [3,4] 1B1 [4,5] 0B0 [4,5] 0B1 [5,6]
    assert simulate(dag, dag.durations(dag.all_frozen())).makespan == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("schedule", "ranks"), [("1F1B", 4), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2)]
)
def test_timer_retimes_like_simulate_and_its_slack_is_exact(schedule: str, ranks: int) -> None:
    """`Timer` (what the heuristic re-times with) gives `simulate`'s step time, ends and critical
    path for any frozen plan, and its slack is exact: an action lengthened by its slack leaves the
    step as it was, a little more does not."""
    import random

    dag = build_dag(make_profile(schedule=schedule, ranks=ranks, microbatches=8, groups=3))
    keys = sorted(dag.all_frozen())
    timer = Timer(dag)
    rng = random.Random(1)
    for _ in range(5):
        plan = {k: 1.0 for k in keys if rng.random() < 0.4}
        tl = simulate(dag, dag.durations(plan))
        d = timer.durations(plan)
        assert d == pytest.approx([tl.end[a] - tl.start[a] for a in dag.order], abs=1e-12)
        span, end, path = timer.run(d)
        assert span == tl.makespan
        assert end.tolist() == [tl.end[a] for a in dag.order]
        assert tuple(path) == tl.critical_path
        slack = timer.slack(d, end, span)
        assert min(slack) == pytest.approx(0.0, abs=1e-9)
        assert all(slack[dag.order.index(a)] == pytest.approx(0.0, abs=1e-9) for a in path)
        for i in rng.sample(range(len(d)), 6):
            longer = list(d)
            longer[i] += slack[i]
            assert timer.run(longer)[0] == pytest.approx(span, rel=1e-9)
            longer[i] += 1.0
            assert timer.run(longer)[0] > span + 0.5


def test_the_passes_compile_without_a_writable_cache(tmp_path: Path) -> None:
    """Where numba has nowhere to write its cache (a read-only install and home), the passes are
    compiled in the process instead of failing. numba is told so by allowing only a cache
    location that never applies (the tests may run as root, which ignores file modes)."""
    dag = build_dag(make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3))
    code = (
        "import sys; from freezeopt.model.dag import build_dag; from freezeopt.model.simulate import simulate;"
        "from tests.conftest import make_profile;"
        "dag = build_dag(make_profile(schedule='1F1B', ranks=4, microbatches=8, groups=3));"
        "print(repr(simulate(dag, dag.durations(dag.all_frozen())).makespan))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    want = simulate(dag, dag.durations(dag.all_frozen())).makespan
    assert float(run.stdout) == want
