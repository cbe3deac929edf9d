"""The array-built LP (freezeopt.solver.lp_arrays) has the plain PuLP LP's optimum, cold and warm."""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from pathlib import Path

import networkx as nx
import pytest

from freezeopt.errors import InputError
from freezeopt.model.dag import PipelineDag, build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import FreezeProblem, SolveOptions, solve
from freezeopt.solver.lp_arrays import FastLP, LpCache
from freezeopt.solver.modes import LpRelaxation
from freezeopt.solver.problem import Spent
from freezeopt.solver.pulp_model import PulpModel
from tests.conftest import make_profile

SCHEDULES = [
    ("1F1B", 1),
    ("GPipe", 1),
    ("Interleaved1F1B", 2),
    ("ZBVZeroBubble", 2),
    ("DualPipeV", 2),
]


def _instance(seed: int) -> tuple[PipelineDag, tuple, SolveOptions, str]:
    """A random but reproducible instance: schedule, size, groups, budget, caps, estimator."""
    rng = random.Random(seed)
    schedule, _spr = SCHEDULES[seed % len(SCHEDULES)]
    ranks = rng.choice([2, 3, 4]) if schedule != "DualPipeV" else 2
    mbs = rng.choice([4, 6, 8]) if schedule not in ("Interleaved1F1B", "DualPipeV") else 2 * ranks
    groups = rng.choice([1, 2, 3, 4])
    sens = rng.choice(["gns", "gns", "numel", "flat", "norm"])
    opts = SolveOptions(
        mode="lp",
        budget=rng.choice([0.0, 0.02, 0.1, 0.3, 1.0]),
        group_cap=rng.choice([0.25, 0.5, 0.75, 1.0]),
        stage_cap=rng.choice([None, None, 0.3, 0.9]),
        sensitivity=sens,  # type: ignore[arg-type]
        tolerance=rng.choice([0.0, 0.0, 0.01]),
    )
    p = make_profile(
        schedule=schedule,
        ranks=ranks,
        microbatches=mbs,
        groups=groups,
        seed=seed,
        lag_ms=rng.choice([0.0, 0.1, 2.0]),
        last_stage_factor=rng.choice([1.0, 1.5]),
    )
    dag = build_dag(p)
    return dag, estimate_signal(p, sens), opts, f"{schedule} r{ranks} mb{mbs} g{groups} {opts}"


def _reference(dag: PipelineDag, signal: tuple, opts: SolveOptions, solver: str):
    """The plain PuLP LP (both phases) with `solver`: phase-1 T and the phase-2 plan's signal."""
    o = dataclasses.replace(opts, solver=solver)  # type: ignore[arg-type]
    m = FreezeProblem(dag, signal, o)
    t1, plan = PulpModel(m, Spent()).solve_lp(time.perf_counter() + 60, write=None)
    return t1, m.signal_of(plan), m


# CBC's solution file carries about 8 significant digits, so its phase-1 T (and with it phase 2's
# bound on T) is rounded; where signal falls steeply with T that moves its phase-2 optimum by more
# than 1e-6. HiGHS through PuLP reads values in memory: it is held to 1e-6 on both.
CBC_SIGNAL_REL = 1e-4


@pytest.mark.parametrize("seed", range(30))
def test_fast_lp_equals_pulp_lp(seed: int) -> None:
    dag, signal, opts, what = _instance(seed)
    ans = FastLP.for_problem(FreezeProblem(dag, signal, opts)).solve()
    for solver, sig_rel in (("highs", 1e-6), ("cbc", CBC_SIGNAL_REL)):
        if solver == "cbc" and seed % 3:
            continue  # CBC on every third instance: it is the slow reference
        t_ref, sig_ref, m = _reference(dag, signal, opts, solver)
        assert ans.t1 == pytest.approx(t_ref, rel=1e-6), (solver, what)
        assert ans.signal == pytest.approx(sig_ref, rel=sig_rel, abs=1e-9), (solver, what)
    # the answer is a plan of its own: within budget and caps, and as fast as its bound says
    assert m.signal_of(ans.x) == pytest.approx(ans.signal, rel=1e-6, abs=1e-9)
    assert ans.signal <= opts.budget + 1e-7
    assert m.fits(ans.x), what
    makespan = simulate(dag, dag.durations(ans.x)).makespan
    assert makespan <= ans.t1 * (1 + opts.tolerance) * (1 + 1e-6) + 1e-6, what
    assert set(ans.x) == set(m.keys)


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
@pytest.mark.parametrize("budget", [0.0, 0.1, 1.0])
def test_fast_lp_equals_both_solvers(schedule: str, budget: float) -> None:
    ranks = 4 if schedule == "1F1B" else 2
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=8, groups=4, seed=11)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", budget=budget, stage_cap=0.9 if budget == 1.0 else None)
    signal = estimate_signal(p, opts.sensitivity)
    ans = FastLP.for_problem(FreezeProblem(dag, signal, opts)).solve()
    for solver, sig_rel in (("highs", 1e-6), ("cbc", CBC_SIGNAL_REL)):
        t_ref, sig_ref, _ = _reference(dag, signal, opts, solver)
        assert ans.t1 == pytest.approx(t_ref, rel=1e-6), solver
        assert ans.signal == pytest.approx(sig_ref, rel=sig_rel, abs=1e-9), solver
    if budget == 0.0:
        assert ans.t1 == pytest.approx(simulate(dag).makespan, rel=1e-9)
        assert ans.signal == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_interior_point_phase_one_gives_the_same_answer(schedule: str) -> None:
    """Large DAGs run phase 1 by interior point (and crossover); same optimum, warm re-solve too."""
    p = make_profile(schedule=schedule, ranks=3, microbatches=6, groups=3, seed=2)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", budget=0.15, stage_cap=0.8)
    signal = estimate_signal(p, opts.sensitivity)
    simplex = FastLP.for_problem(FreezeProblem(dag, signal, opts)).solve()
    f = FastLP.for_problem(FreezeProblem(dag, signal, opts))
    f.method = "ipm"
    ipm = f.solve()
    assert (simplex.method, ipm.method) == ("simplex", "ipm")
    assert ipm.t1 == pytest.approx(simplex.t1, rel=1e-6)
    assert ipm.signal == pytest.approx(simplex.signal, rel=1e-6, abs=1e-9)
    dag2 = _perturbed(dag, seed=1)
    again = f.resolve(dag2)
    cold = FastLP.for_problem(FreezeProblem(dag2, signal, opts)).solve()
    assert again.t1 == pytest.approx(cold.t1, rel=1e-6)
    assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("pivots", [0, 10**6])
def test_large_warm_resolve_falls_back_to_a_cold_interior_point(
    pivots: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its pivot budget a warm phase 1 on a large DAG is solved cold; same answer."""
    import freezeopt.solver.lp_arrays as lp_fast

    monkeypatch.setattr(lp_fast, "WARM_PIVOTS", float(pivots))
    monkeypatch.setattr(lp_fast, "WARM_MIN_PIVOTS", 0)
    p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=2, seed=4)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", budget=0.1)
    signal = estimate_signal(p, opts.sensitivity)
    m = FreezeProblem(dag, signal, opts)
    f = FastLP(
        dag, keys=m.keys, loss=m.loss, kmax=m.kmax, budget=opts.budget, stage_cap=None, method="ipm"
    )
    f.solve()
    dag2 = _perturbed(dag, seed=3)
    again = f.resolve(dag2)
    assert again.warm and again.method == ("ipm" if pivots == 0 else "simplex")
    cold = FastLP.for_problem(FreezeProblem(dag2, signal, opts)).solve()
    assert again.t1 == pytest.approx(cold.t1, rel=1e-6)
    assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9)
    # a model whose warm attempt gave up re-solves cold from then on, whatever the budget
    monkeypatch.setattr(lp_fast, "WARM_PIVOTS", 1e6)
    third = f.resolve(_perturbed(dag, seed=4))
    assert third.method == ("ipm" if pivots == 0 else "simplex")
    cold = FastLP.for_problem(FreezeProblem(_perturbed(dag, seed=4), signal, opts)).solve()
    assert third.t1 == pytest.approx(cold.t1, rel=1e-6)


def test_same_rank_edges_are_left_out_and_cross_rank_kept() -> None:
    """F → B and I → W on one rank follow from program order; lagged cross-rank edges stay."""
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4, groups=2, lag_ms=1.0)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp")
    f = FastLP.for_problem(FreezeProblem(dag, estimate_signal(p, opts.sensitivity), opts))
    order = dag.order
    kept = {(order[u], order[v]) for u, v in zip(f._arr.src, f._arr.dst, strict=True)}
    left_out = {(order[u], order[v]) for u, _, v in f._arr.drop}
    assert kept | left_out == set(dag.graph.edges) and not kept & left_out
    assert f.info["edges_dropped"] == len(left_out) > 0
    same_rank = {(u, v) for u, v in dag.graph.edges if dag.rank_of[u] == dag.rank_of[v]}
    program = {(u, v) for acts in dag.rank_actions for u, v in itertools.pairwise(acts)}
    assert same_rank - program <= left_out  # every non-consecutive same-rank edge goes
    assert program <= kept
    lagged = {(u, v) for u, v in dag.graph.edges if dag.graph.edges[u, v]["lag"] > 0}
    assert lagged and lagged <= kept  # nothing on another rank implies a 1 ms message here


def _perturbed(dag: PipelineDag, seed: int, share: float = 0.05) -> PipelineDag:
    """The same schedule with some stages' action and group costs changed by ±share."""
    rng = random.Random(seed)
    stages = rng.sample(range(dag.n_stages), max(1, dag.n_stages // 3))
    factor = {s: 1 + rng.choice([-share, share]) for s in stages}
    cost = {a: c * factor.get(a.stage, 1.0) for a, c in dag.cost.items()}
    group_cost = tuple(
        tuple(c * factor.get(s, 1.0) for c in row) for s, row in enumerate(dag.group_cost)
    )
    return dataclasses.replace(dag, cost=cost, group_cost=group_cost)


@pytest.mark.parametrize(
    ("schedule", "ranks", "stage_cap"),
    [("1F1B", 4, None), ("Interleaved1F1B", 2, 0.5), ("ZBVZeroBubble", 3, None)],
)
def test_warm_resolve_equals_cold_solve(schedule: str, ranks: int, stage_cap) -> None:
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=2 * ranks, groups=3, seed=5)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", budget=0.1, stage_cap=stage_cap)
    signal = estimate_signal(p, opts.sensitivity)
    warm = FastLP.for_problem(FreezeProblem(dag, signal, opts))
    first = warm.solve()
    assert not first.warm
    for i in range(3):
        dag_i = _perturbed(dag, seed=i)
        again = warm.resolve(dag_i)
        cold = FastLP.for_problem(FreezeProblem(dag_i, signal, opts)).solve()
        ref, sig_ref, _ = _reference(dag_i, signal, opts, "highs")
        assert again.warm
        assert again.t1 == pytest.approx(cold.t1, rel=1e-6) == ref
        assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9)
        assert again.signal == pytest.approx(sig_ref, rel=1e-6, abs=1e-9)
        assert simulate(dag_i, dag_i.durations(again.x)).makespan <= again.t1 * (1 + 1e-6)
    # and back to the original costs: the first answer again
    back = warm.resolve(dag)
    assert back.t1 == pytest.approx(first.t1, rel=1e-9)
    assert back.signal == pytest.approx(first.signal, rel=1e-6, abs=1e-9)


def test_warm_resolve_with_new_lags_and_a_broken_reduction() -> None:
    """New lags change right-hand sides; a lag that breaks a left-out edge's implication makes
    the model rebuild itself, and either way the answer is the cold one."""
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4, groups=2, seed=7)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp", budget=0.2)
    signal = estimate_signal(p, opts.sensitivity)
    f = FastLP.for_problem(FreezeProblem(dag, signal, opts))
    first = f.solve()
    order = dag.order
    g2: nx.DiGraph = dag.graph.copy()
    for u, v in list(g2.edges)[::3]:
        if g2.edges[u, v]["lag"] > 0:
            g2.edges[u, v]["lag"] *= 3.0
    new_lags = dataclasses.replace(dag, graph=g2)
    again = f.resolve(new_lags)
    cold = FastLP.for_problem(FreezeProblem(new_lags, signal, opts)).solve()
    assert again.t1 == pytest.approx(cold.t1, rel=1e-6)
    assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9)
    # a left-out same-rank edge made to carry a long wait is no longer implied
    u, _, v = (int(i) for i in f._arr.drop[0])
    g3: nx.DiGraph = dag.graph.copy()
    g3.edges[order[u], order[v]]["lag"] = 1000.0
    broken = dataclasses.replace(dag, graph=g3)
    again = f.resolve(broken)
    cold = FastLP.for_problem(FreezeProblem(broken, signal, opts)).solve()
    assert again.t1 == pytest.approx(cold.t1, rel=1e-6)
    assert again.t1 > first.t1 + 900.0  # the long wait is in the answer
    assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9)


def test_resolve_refuses_another_schedule() -> None:
    p = make_profile(schedule="1F1B", ranks=2, microbatches=4)
    dag = build_dag(p)
    opts = SolveOptions(mode="lp")
    f = FastLP.for_problem(FreezeProblem(dag, estimate_signal(p, opts.sensitivity), opts))
    f.solve()
    other = build_dag(make_profile(schedule="1F1B", ranks=2, microbatches=6))
    with pytest.raises(InputError, match="same schedule"):
        f.resolve(other)


def test_lp_cache_solves_warm_only_when_only_costs_changed() -> None:
    """`solve(..., lp_cache=)` answers as a cold solve does; it re-solves warm after a cost change
    and cold after a change of options or of schedule."""
    p = make_profile(schedule="1F1B", ranks=3, microbatches=6, groups=3, seed=4)
    dag = build_dag(p)
    opts = SolveOptions(mode="heuristic", solver="highs", budget=0.1)
    signal = estimate_signal(p, opts.sensitivity)
    cache = LpCache()
    steps = [
        (dag, opts, False),
        (_perturbed(dag, seed=1), opts, True),
        (_perturbed(dag, seed=2), opts, True),
        (_perturbed(dag, seed=2), dataclasses.replace(opts, budget=0.2), False),
        (_perturbed(dag, seed=3), dataclasses.replace(opts, budget=0.2), True),
    ]
    for i, (d, o, _) in enumerate(steps):
        got = solve(d, signal, o, lp_cache=cache)
        cold = solve(d, signal, o)
        assert cache.solves == i + 1
        assert cache.warm_solves == sum(w for _, _, w in steps[: i + 1]), i
        assert got.lp_bound_ms == pytest.approx(cold.lp_bound_ms, rel=1e-6)
        assert got.signal_dropped <= o.budget + 1e-9
        assert got.predicted_ms == pytest.approx(
            simulate(d, d.durations(got.frozen)).makespan, rel=1e-12
        )
    # another schedule: built again, cold
    p2 = make_profile(schedule="GPipe", ranks=3, microbatches=6, groups=3, seed=4)
    d2 = build_dag(p2)
    sig2 = estimate_signal(p2, opts.sensitivity)
    got = solve(d2, sig2, opts, lp_cache=cache)
    assert cache.warm_solves == 3
    assert got.lp_bound_ms == pytest.approx(solve(d2, sig2, opts).lp_bound_ms, rel=1e-6)
    warm = solve(_perturbed(d2, seed=5), sig2, opts, lp_cache=cache)
    assert cache.warm_solves == 4
    cold = solve(_perturbed(d2, seed=5), sig2, opts)
    assert warm.lp_bound_ms == pytest.approx(cold.lp_bound_ms, rel=1e-6)


def test_solve_with_highs_uses_it_and_still_writes_the_pulp_model(tmp_path: Path) -> None:
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4, groups=2)
    dag = build_dag(p)
    out = tmp_path / "m.lp"
    opts = SolveOptions(mode="lp", solver="highs", budget=0.1, write_model=out)
    r = solve(dag, estimate_signal(p, opts.sensitivity), opts)
    cbc = solve(
        dag,
        estimate_signal(p, opts.sensitivity),
        dataclasses.replace(opts, solver="cbc", write_model=None),
    )
    assert r.lp_bound_ms == pytest.approx(cbc.lp_bound_ms, rel=1e-6)
    assert r.signal_dropped == pytest.approx(cbc.signal_dropped, rel=1e-6)
    assert "prec_" in out.read_text() and "piece_s0_g0_k0" in out.read_text()
    assert "makespan_limit" in (tmp_path / "m.phase2.lp").read_text()


@pytest.mark.parametrize("seed", range(0, 30, 3))
def test_fixing_every_key_leaves_the_plans_simulated_step_time(seed: int) -> None:
    """`FastLP.fix` with every key fixed to an integer plan (one that fits budget and caps) leaves
    the LP nothing to choose: phase 1's optimum is the plan's simulated step time, and phase 2
    returns the plan itself."""
    dag, signal, opts, what = _instance(seed)
    m = FreezeProblem(dag, signal, opts)
    rng = random.Random(seed)
    plan: dict = {}
    for k in rng.sample(m.keys, len(m.keys)):
        if m.fits({**plan, k: 1.0}):
            plan[k] = 1.0
    lp = FastLP.for_problem(FreezeProblem(dag, signal, opts))
    free = lp.solve()
    lp.fix(
        ones=[i for i, k in enumerate(lp.keys) if k in plan],
        zeros=[i for i, k in enumerate(lp.keys) if k not in plan],
    )
    fixed = lp.solve()
    assert fixed.t1 == pytest.approx(m.makespan(plan), rel=1e-7, abs=1e-7), what
    assert fixed.t1 >= free.t1 - 1e-7, what
    assert {k for k, x in fixed.x.items() if x > 0.5} == set(plan), what
    assert all(min(x, 1 - x) < 1e-9 for x in fixed.x.values()), what


@pytest.mark.parametrize("seed", range(1, 30, 3))
def test_phase_one_alone_interleaves_with_both_phases(seed: int) -> None:
    """`solve(phase2=False)` (what each round of the dive runs) leaves phase 1's objective and
    basis in place; a later `solve()` or `resolve()` restores what it needs: every answer equals
    a cold solve of the same LP."""
    dag, signal, opts, what = _instance(seed)
    cold = FastLP.for_problem(FreezeProblem(dag, signal, opts)).solve()
    lp = FastLP.for_problem(FreezeProblem(dag, signal, opts))
    only1 = lp.solve(phase2=False)
    assert only1.iterations[1] == 0, what
    assert only1.t1 == pytest.approx(cold.t1, rel=1e-9, abs=1e-9), what
    # phase 1's own plan reaches T1 and fits
    assert simulate(dag, dag.durations(only1.x)).makespan <= only1.t1 * (1 + 1e-6) + 1e-9, what
    assert FreezeProblem(dag, signal, opts).fits(only1.x), what
    for again in (lp.solve(), lp.solve(phase2=False), lp.solve()):
        assert again.warm and again.t1 == pytest.approx(cold.t1, rel=1e-9, abs=1e-9), what
    assert again.signal == pytest.approx(cold.signal, rel=1e-6, abs=1e-9), what
    lp.solve(phase2=False)
    dag2 = _perturbed(dag, seed)
    moved = lp.resolve(dag2)
    ref = FastLP.for_problem(FreezeProblem(dag2, signal, opts)).solve()
    assert moved.t1 == pytest.approx(ref.t1, rel=1e-6, abs=1e-9), what
    assert moved.signal == pytest.approx(ref.signal, rel=1e-6, abs=1e-9), what


def test_the_lp_of_a_solve_of_its_own_is_handed_to_the_dive_and_a_shared_one_is_not() -> None:
    """`LpRelaxation.take` hands over the relaxation's solved HiGHS model once (`LpCache.take`), so
    the dive skips a cold solve; a cache shared by re-plans keeps its model for warm re-solves."""
    p = make_profile(schedule="1F1B", ranks=3, microbatches=6, groups=3, seed=4)
    dag = build_dag(p)
    opts = SolveOptions(mode="milp", solver="highs", budget=0.1)
    signal = estimate_signal(p, opts.sensitivity)
    relaxation = LpRelaxation(FreezeProblem(dag, signal, opts))
    t1, _ = relaxation.solve(time.perf_counter() + 60, write=None)
    lp = relaxation.take()
    assert lp is not None and relaxation.take() is None
    again = lp.solve(phase2=False)
    assert again.warm and again.iterations == (0, 0)
    assert again.t1 == pytest.approx(t1, rel=1e-12)
    cache = LpCache()
    shared = LpRelaxation(FreezeProblem(dag, signal, opts), lp_cache=cache)
    shared.solve(time.perf_counter() + 60, write=None)
    assert shared.take() is None
    solve(_perturbed(dag, seed=1), signal, dataclasses.replace(opts, mode="lp"), lp_cache=cache)
    assert cache.warm_solves == 1
    assert cache.take() is not None and cache.take() is None
    solve(dag, signal, dataclasses.replace(opts, mode="lp"), lp_cache=cache)
    assert (cache.solves, cache.warm_solves) == (3, 1)  # taken: built anew
