"""Backward truncation in the model: where every group before a point of a stage is frozen in a
microbatch (and every stage before it frozen whole), the input-gradient work below is saved too;
the DAG times it, the LP and MILP see it, and their bound stays a bound."""

from __future__ import annotations

import dataclasses

import pytest

from freezeopt.actions import Action
from freezeopt.formats.profile import Stat
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import SolveOptions, solve
from tests.conftest import make_profile


def _truncated(profile, gains, *, all_grouped=True):
    """`profile` with `gains[s]` (entry 0, then one per group) as stage s's truncation gains."""
    stages = tuple(
        dataclasses.replace(
            st,
            truncation_ms=tuple(Stat(median=v, p10=v, p90=v, n=1) for v in gains[st.stage]),
            all_grouped=all_grouped,
        )
        for st in profile.stages
    )
    return dataclasses.replace(profile, stages=stages)


def _b(s: int, m: int) -> Action:
    return Action(stage=s, kind="B", microbatch=m)


def test_the_dag_saves_what_the_frozen_prefix_skips() -> None:
    p = make_profile(groups=2, microbatches=4)  # 1F1B, 2 ranks, 2 stages
    gains = {0: (0.0, 1.0, 0.5), 1: (2.0, 3.0, 0.25)}
    dag = build_dag(_truncated(p, gains))
    c = dag.group_cost
    base = dag.durations({})
    # stage 0, microbatch 1: group 0 frozen saves its cost and the input-gradient work below group 1
    d = dag.durations({(_b(0, 1), 0): 1.0})
    assert d[_b(0, 1)] == pytest.approx(base[_b(0, 1)] - c[0][0] - 1.0)
    # group 1 alone: no prefix, its weight-gradient cost only
    d = dag.durations({(_b(0, 1), 1): 1.0})
    assert d[_b(0, 1)] == pytest.approx(base[_b(0, 1)] - c[0][1])
    # stage 0 frozen whole in microbatch 2: stage 1 needs no input gradient there (gain 2.0), and
    # with its group 0 frozen too, 3.0 more
    whole = {(_b(0, 2), 0): 1.0, (_b(0, 2), 1): 1.0}
    d = dag.durations(whole)
    assert d[_b(0, 2)] == pytest.approx(base[_b(0, 2)] - c[0][0] - c[0][1] - 1.5)
    assert d[_b(1, 2)] == pytest.approx(base[_b(1, 2)] - 2.0)
    d = dag.durations({**whole, (_b(1, 2), 0): 1.0})
    assert d[_b(1, 2)] == pytest.approx(base[_b(1, 2)] - c[1][0] - 2.0 - 3.0)
    # a fractional extent (an lp plan's ratio, drawn at random) is not frozen whole: no truncation
    d = dag.durations({(_b(0, 1), 0): 0.5})
    assert d[_b(0, 1)] == pytest.approx(base[_b(0, 1)] - 0.5 * c[0][0])
    # a stage with parameters outside its groups passes nothing on
    d = build_dag(_truncated(p, gains, all_grouped=False)).durations(whole)
    assert d[_b(1, 2)] == pytest.approx(base[_b(1, 2)])
    # without measured gains nothing changes
    assert build_dag(p).durations(whole)[_b(1, 2)] == pytest.approx(base[_b(1, 2)])


@pytest.mark.parametrize("mode", ["lp", "milp"])
def test_the_solver_exploits_truncation_and_its_bound_holds(mode: str) -> None:
    p = make_profile(groups=2, microbatches=8)
    plain = build_dag(p)
    # gains as large as a group's cost: freezing a prefix pays twice
    gains = {s: (0.5 * min(plain.group_cost[s]), *plain.group_cost[s]) for s in range(2)}
    tp = _truncated(p, {s: tuple(0.45 * v for v in g) for s, g in gains.items()})
    opts = SolveOptions(mode=mode, budget=0.3, sensitivity="numel", time_limit=30)  # type: ignore[arg-type]
    with_t = solve(build_dag(tp), estimate_signal(tp, "numel"), opts)
    without = solve(plain, estimate_signal(p, "numel"), opts)
    # the prediction is what the simulator gives the plan, truncation included
    assert with_t.predicted_ms == pytest.approx(
        simulate(build_dag(tp), build_dag(tp).durations(with_t.frozen)).makespan
    )
    assert with_t.predicted_ms < without.predicted_ms - 1e-6  # it used the cheaper prefix
    assert with_t.lp_bound_ms <= with_t.predicted_ms + 1e-6
    assert with_t.all_frozen_ms < without.all_frozen_ms  # the floor counts truncation too


def test_split_backwards_are_not_truncated_but_stage_0s_w_is() -> None:
    """In split schedules only stage 0's W runs a whole backward (the runtime truncates only
    whole backwards): the other stages' I/W actions get no truncation saving."""
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4, groups=2)
    gains = {s: (0.1, 0.2, 0.3) for s in range(4)}
    dag = build_dag(_truncated(p, gains))
    acts = dag.truncated()
    assert acts and all(
        a.kind == "B" or (a.kind == "W" and a.stage == 0)
        for row in acts.values()
        for a in row.values()
    )
    assert set(acts) == {0}  # ZBV: stage 0's backward is its W; the other stages split theirs
