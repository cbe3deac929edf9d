"""Planning without the LP: the rank-load bound never exceeds the LP optimum, the bisection finds
the exact min–max allocation, and the balanced start keeps the budget and caps."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pulp
import pytest

from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import FreezeProblem, SolveOptions
from freezeopt.solver.balance import (
    _rank_pairs,
    _sorted_counts,
    _whole_counts,
    balanced_plan,
    rank_bound,
    rank_needs,
)
from freezeopt.solver.lp_arrays import FastLP
from tests.conftest import SHAPES, make_profile

CASES = [
    (schedule, ranks, mbs, groups, seed)
    for (schedule, ranks, mbs), groups, seed in itertools.product(
        SHAPES,
        (1, 3),
        (0, 1),
    )
]


def _model(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, **kw: object
) -> FreezeProblem:
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=mbs, groups=groups, seed=seed)
    opts = SolveOptions(**kw)  # type: ignore[arg-type]
    dag = build_dag(p)
    return FreezeProblem(dag, estimate_signal(p, opts.sensitivity), opts)


def _bound(m: FreezeProblem) -> float:
    need = rank_needs(m)
    return rank_bound(m, need)


@pytest.mark.parametrize(("schedule", "ranks", "mbs", "groups", "seed"), CASES)
@pytest.mark.parametrize("budget", [0.05, 0.3, 1.0])
def test_rank_bound_never_exceeds_the_lp_optimum(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, budget: float
) -> None:
    m = _model(schedule, ranks, mbs, groups, seed, budget=budget, solver="highs")
    lp = FastLP(
        m.dag, keys=m.keys, loss=m.loss, kmax=m.kmax, budget=budget, stage_cap=None, tolerance=0.0
    )
    t_lp = lp.solve(time_limit=60).t1
    bound = _bound(m)
    assert bound <= t_lp * (1 + 1e-9) + 1e-9
    assert bound > 0.5 * m.makespan({})  # a bound worth reporting, not a trivial one


def test_rank_bound_is_the_exact_min_max_allocation() -> None:
    """The bisection equals the same relaxation posed as an LP in PuLP (levels, counts, the convex
    loss by its linear pieces), on several instances and budgets."""
    for (schedule, ranks, mbs, groups, seed), budget in itertools.product(CASES[::3], (0.02, 0.2)):
        m = _model(schedule, ranks, mbs, groups, seed, budget=budget)
        need = rank_needs(m)
        prob = pulp.LpProblem("minmax", pulp.LpMinimize)
        tau = prob.add_variable("tau")
        k = {sg: prob.add_variable(f"k_{sg[0]}_{sg[1]}", 0, m.kmax) for sg in m.by_group}
        ell = {sg: prob.add_variable(f"l_{sg[0]}_{sg[1]}", 0) for sg in m.by_group}
        prob += tau
        stage_rank = {a.stage: r for r, acts in enumerate(m.dag.rank_actions) for a in acts}
        for r, n in enumerate(need):
            cut = [m.dag.group_cost[s][g] * k[(s, g)] for (s, g) in k if stage_rank[s] == r]
            prob += tau >= float(n) - pulp.lpSum(cut), f"rank_{r}"
        for sg, loss in m.loss.items():
            if sg not in k:
                continue
            for j in range(m.kmax):  # ℓ ≥ each linear piece of the convex loss curve
                slope = loss[j + 1] - loss[j]
                prob += ell[sg] >= loss[j] + slope * (k[sg] - j), f"piece_{sg[0]}_{sg[1]}_{j}"
        prob += pulp.lpSum(ell.values()) <= budget, "budget"
        prob.solve(pulp.HiGHS(msg=False))
        assert pulp.LpStatus[prob.status] == "Optimal"
        assert _bound(m) == pytest.approx(tau.value(), rel=1e-7, abs=1e-6)


def test_rank_needs_without_freezing_bound_the_unfrozen_step() -> None:
    for case in CASES:
        m = _model(*case)
        need = rank_needs(m)
        assert max(need) <= m.makespan({}) + 1e-9
        m0 = _model(*case, budget=0.0)
        assert _bound(m0) == pytest.approx(max(rank_needs(m0)))


@pytest.mark.parametrize(("schedule", "ranks", "mbs", "groups", "seed"), CASES[::2])
@pytest.mark.parametrize("stage_cap", [None, 0.5])
def test_balanced_plan_keeps_budget_and_caps_and_shortens_the_step(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, stage_cap: float | None
) -> None:
    m = _model(schedule, ranks, mbs, groups, seed, budget=0.1, group_cap=0.5, stage_cap=stage_cap)
    plan = balanced_plan(m, rank_needs(m))
    assert plan and set(plan.values()) == {1.0} and set(plan) <= set(m.keys)
    assert m.fits(plan)
    assert m.makespan(plan) < m.makespan({})
    # deterministic: the same inputs, the same plan
    again = balanced_plan(m, rank_needs(m))
    assert list(again.items()) == list(plan.items())


@pytest.mark.parametrize(("schedule", "ranks", "mbs", "groups", "seed"), CASES)
@pytest.mark.parametrize("budget", [0.02, 0.1, 1.0])
def test_whole_counts_on_arrays_are_the_loops(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, budget: float
) -> None:
    """Without stage caps the start's counts come from sorting units, not a unit at a time: the
    same counts as the loop on the test profiles."""
    m = _model(schedule, ranks, mbs, groups, seed, budget=budget, group_cap=0.5)
    need = rank_needs(m)
    per_rank = _rank_pairs(m.dag, list(m.by_group))
    got = _sorted_counts(m.dag.group_cost, need, per_rank, m.loss, m.kmax, budget)
    want = _whole_counts(
        m.dag, need, per_rank, m.loss, kmax=m.kmax, budget=budget, stage_share=m.stage_share,
        stage_cap=math.inf, sort=False,
    )  # fmt: skip
    assert got == want


def test_whole_counts_on_arrays_break_ties_as_the_loop() -> None:
    """Equal levels, equal costs and equal loss curves everywhere, empty ranks, curves that run
    out: 300 random instances, the same counts as the loop (and None where a curve is not
    convex, which only the loop handles)."""
    rng = np.random.default_rng(0)
    for trial in range(300):
        n_ranks, kmax = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        cost: dict[int, list[float]] = {}
        loss: dict[tuple[int, int], list[float]] = {}
        per_rank: list[list[tuple[int, int]]] = []
        stage = 0
        for _ in range(n_ranks):
            mine = []
            for _ in range(int(rng.integers(0, 3))):  # stages on this rank (0: nothing to freeze)
                ng = int(rng.integers(1, 4))
                cost[stage] = [float(rng.choice([0.5, 1.0, 2.0])) for _ in range(ng)]
                for g in range(ng):
                    # dyadic steps: the curve's differences come back exactly (convex)
                    steps = np.sort(rng.choice([0.0, 1 / 64, 1 / 32, 1 / 16], size=kmax))
                    loss[(stage, g)] = np.concatenate(([0.0], np.cumsum(steps))).tolist()
                    mine.append((stage, g))
                stage += 1
            per_rank.append(mine)
        dag = SimpleNamespace(group_cost=cost)
        need = rng.choice([3.0, 4.0, 5.0], size=n_ranks)
        budget = float(rng.choice([0.0, 1 / 32, 0.1, 1.0]))
        share = dict.fromkeys(loss, 1.0)
        want = _whole_counts(
            dag, need, per_rank, loss, kmax=kmax, budget=budget, stage_share=share,
            stage_cap=math.inf, sort=False,
        )  # fmt: skip
        assert _sorted_counts(cost, need, per_rank, loss, kmax, budget) == want, trial
    bent = {(0, 0): [0.0, 0.05, 0.06]}  # not convex
    assert _sorted_counts({0: [1.0]}, np.array([1.0]), [[(0, 0)]], bent, 2, 1.0) is None
