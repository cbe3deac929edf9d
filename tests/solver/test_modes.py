"""The solver: honest bounds, budgets that hold, and TimelyFreeze's LP reproduced exactly."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest

from freezeopt.compare.timelyfreeze import solve_timelyfreeze_lp
from freezeopt.errors import InputError, LpUnsolved
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import SolveOptions, solve
from freezeopt.solver.balance import balanced_plan, rank_bound, rank_needs
from tests.conftest import SHAPES, make_profile, solve_model


def _solve(profile, **kw):
    opts = SolveOptions(**kw)
    dag = build_dag(profile)
    return dag, solve(dag, estimate_signal(profile, opts.sensitivity), opts)


@pytest.mark.parametrize(("schedule", "ranks", "mbs"), SHAPES)
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_lp_reproduces_timelyfreeze(schedule: str, ranks: int, mbs: int, solver: str) -> None:
    """One group per stage, flat sensitivity, no budget, per-stage cap 0.9: TimelyFreeze's LP."""
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=mbs, groups=1, seed=3)
    dag, r = _solve(
        p, mode="lp", solver=solver, budget=1.0, group_cap=1.0, stage_cap=0.9, sensitivity="flat"
    )
    tf = solve_timelyfreeze_lp(dag, stage_cap=0.9)
    assert r.lp_bound_ms == pytest.approx(tf.makespan, rel=1e-6)
    assert r.predicted_ms == pytest.approx(tf.makespan, rel=1e-6)
    assert sum(r.frozen.values()) == pytest.approx(sum(tf.ratios.values()), abs=1e-3)
    # the per-stage cap holds in both
    for s in range(dag.n_stages):
        assert sum(x for (a, _), x in r.frozen.items() if a.stage == s) <= 0.9 * mbs + 1e-6


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
@pytest.mark.parametrize("mode", ["lp", "heuristic", "milp"])
def test_prediction_is_the_simulated_step_time(schedule: str, mode: str) -> None:
    p = make_profile(schedule=schedule, microbatches=4, groups=2)
    dag, r = _solve(p, mode=mode, budget=0.2, time_limit=20)
    assert r.predicted_ms == pytest.approx(simulate(dag, dag.durations(r.frozen)).makespan)
    assert r.all_frozen_ms - 1e-6 <= r.lp_bound_ms <= r.predicted_ms + 1e-6 <= r.baseline_ms + 2e-6
    assert r.signal_dropped <= 0.2 + 1e-6
    assert 0 <= r.gap == pytest.approx((r.predicted_ms - r.lp_bound_ms) / r.predicted_ms)


def test_lp_prediction_equals_its_phase_one_optimum() -> None:
    _dag, r = _solve(make_profile(ranks=4, microbatches=8), mode="lp", budget=0.15)
    assert r.predicted_ms == pytest.approx(r.lp_bound_ms, rel=1e-6)
    assert r.predicted_ms < r.baseline_ms


def test_milp_between_lp_bound_and_heuristic() -> None:
    p = make_profile(ranks=2, microbatches=4, groups=2)
    _, lp = _solve(p, mode="lp", budget=0.1)
    _, heur = _solve(p, mode="heuristic", budget=0.1)
    _, milp = _solve(p, mode="milp", budget=0.1, time_limit=30, gap=0.0)
    assert milp.status == "optimal"
    assert lp.lp_bound_ms - 1e-6 <= milp.predicted_ms <= heur.predicted_ms + 1e-6
    assert all(x == 1.0 for x in milp.frozen.values()), "milp answers are binary"


def test_caps_and_budget_hold_for_integer_modes() -> None:
    p = make_profile(ranks=4, microbatches=8, groups=3)
    for mode in ("heuristic", "milp"):
        _dag, r = _solve(p, mode=mode, budget=0.3, group_cap=0.5, time_limit=10)
        counts: dict[tuple[int, int], int] = {}
        for a, g in r.frozen:
            counts[(a.stage, g)] = counts.get((a.stage, g), 0) + 1
        assert max(counts.values()) <= math.floor(0.5 * 8)
        assert r.signal_dropped <= 0.3 + 1e-9


def test_budget_zero_is_the_baseline() -> None:
    for mode in ("lp", "heuristic", "milp"):
        _, r = _solve(make_profile(), mode=mode, budget=0.0)
        assert r.frozen == {}
        assert r.predicted_ms == pytest.approx(r.baseline_ms)
        assert r.signal_dropped == 0.0


def test_bigger_budget_never_slower() -> None:
    p = make_profile(ranks=4, microbatches=8)
    times = [_solve(p, mode="lp", budget=b)[1].predicted_ms for b in (0.0, 0.05, 0.1, 0.3)]
    assert all(t2 <= t1 + 1e-6 for t1, t2 in itertools.pairwise(times))
    assert times[-1] < times[0]


def test_cbc_and_highs_agree() -> None:
    p = make_profile(schedule="ZBVZeroBubble", ranks=2, microbatches=4)
    _, a = _solve(p, mode="lp", solver="cbc", budget=0.1)
    _, b = _solve(p, mode="lp", solver="highs", budget=0.1)
    assert a.lp_bound_ms == pytest.approx(b.lp_bound_ms, rel=1e-6)
    assert a.signal_dropped == pytest.approx(b.signal_dropped, abs=1e-5)


def test_time_limit_is_reported_honestly() -> None:
    """CBC stops on its time limit and PuLP says 'Optimal'; we must not. On a host slow enough
    that not even the LP relaxation fits the second, the solve says that instead (LpUnsolved):
    either way nothing claims an optimum."""
    p = make_profile(ranks=8, microbatches=16, groups=4)
    try:
        _, r = _solve(p, mode="milp", budget=0.1, time_limit=1.0, gap=0.0)
    except LpUnsolved:
        return
    assert r.status in ("time_limit", "heuristic_fallback")
    assert r.notes


def test_deterministic() -> None:
    p = make_profile(ranks=4, microbatches=8)
    _, a = _solve(p, mode="milp", budget=0.1, time_limit=20)
    _, b = _solve(p, mode="milp", budget=0.1, time_limit=20)
    assert a.frozen == b.frozen and a.status == b.status


def test_write_model_names_everything(tmp_path: Path) -> None:
    out = tmp_path / "model.lp"
    _solve(make_profile(), mode="lp", budget=0.1, write_model=out)
    text = out.read_text()
    for name in (
        "prec_0F0_1F0",
        "budget",
        "groupcap_s0_g0",
        "piece_s0_g0_k0",
        "makespan",
        "x_0B0_g0",
        "t_0F0",
    ):
        assert name in text
    phase2 = (tmp_path / "model.phase2.lp").read_text()
    assert "makespan_limit" in phase2
    _solve(make_profile(), mode="lp", budget=0.1, write_model=tmp_path / "model.mps")
    assert (tmp_path / "model.mps").read_text().startswith("*")


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"budget": 1.5}, r"^budget must be a number in \[0, 1\] \(got 1\.5\)$"),
        ({"budget": float("nan")}, "^budget must"),
        ({"group_cap": -0.1}, "^group_cap must"),
        ({"stage_cap": 2.0}, "^stage_cap must"),
        ({"time_limit": 0}, "^time_limit must"),
        ({"threads": 0}, "^threads must"),
        ({"mode": "exact"}, "unknown mode"),
        ({"solver": "gurobi"}, "unknown solver"),
    ],
)
def test_bad_options_are_refused_when_the_options_are_made(kw: dict, msg: str) -> None:
    """`SolveOptions` checks itself, its errors naming the field (the CLI says the flag)."""
    with pytest.raises(InputError, match=msg) as e:
        SolveOptions(**kw)
    flag = "--" + next(iter(kw)).replace("_", "-")
    assert e.value.said({next(iter(kw)): flag}).startswith((flag, "unknown"))


# --- the heuristic's local search (its moves: test_search.py) ----------------------------------


def test_heuristic_search_stops_at_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the deadline the fill and swap searches stop: the answer is the rounded-down LP plan
    (feasible), the status stays `heuristic` and a note says why; with time left they run."""
    import freezeopt.solver.modes as solve_mod
    import freezeopt.solver.pulp_model as pulp_model
    from freezeopt.solver.dive import round_down
    from freezeopt.solver.modes import LpRelaxation
    from freezeopt.solver.problem import Deadline
    from freezeopt.solver.search import search

    p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3)
    dag, model = solve_model(p)
    _, lp_x = LpRelaxation(model).solve(math.inf, write=None)
    clock = Deadline(0.0)
    assert search(model, round_down(model, lp_x), clock) == round_down(model, lp_x) and clock.hit
    clock = Deadline()
    full = search(model, round_down(model, lp_x), clock)
    assert not clock.hit and full != round_down(model, lp_x)

    class Passed(Deadline):
        def passed(self) -> bool:
            self.hit = True
            return True

    monkeypatch.setattr(solve_mod, "Deadline", Passed)
    opts = SolveOptions(mode="heuristic", budget=0.1)
    r = solve(dag, estimate_signal(p, opts.sensitivity), opts)
    assert r.status == "heuristic" and r.signal_dropped <= 0.1 + 1e-9
    assert any("stopped at the time limit" in n for n in r.notes)
    assert r.frozen == {k: v for k, v in sorted(round_down(model, lp_x).items())}
    # a failed LP: the fallback answers the LP-free start, its search stopped at the time limit
    monkeypatch.undo()
    monkeypatch.setattr(pulp_model, "run_pulp", lambda *a, **k: "no_solution")
    late = SolveOptions(mode="milp", budget=0.1, time_limit=1e-6, fallback="heuristic")
    r = solve(dag, estimate_signal(p, late.sensitivity), late)
    start = balanced_plan(model, rank_needs(model))
    assert r.status == "heuristic_fallback" and r.frozen == dict(sorted(start.items())) and start
    assert any("stopped at the time limit" in n for n in r.notes)


def test_model_makespan_is_simulates_step_time_for_any_plan() -> None:
    """`FreezeProblem.makespan` (one Timer per model) gives `simulate`'s step time exactly, fractional
    plans and over-full actions (clipped at zero) included."""
    import dataclasses
    import random

    from freezeopt.solver import FreezeProblem

    p = make_profile(schedule="Interleaved1F1B", ranks=2, microbatches=6, groups=3)
    dag = build_dag(p)
    opts = SolveOptions(mode="heuristic")
    model = FreezeProblem(dag, estimate_signal(p, opts.sensitivity), opts)
    rng = random.Random(4)
    keys = sorted(dag.all_frozen())
    for _ in range(10):
        plan = {k: rng.choice([0.0, 0.3, 1.0]) for k in keys if rng.random() < 0.6}
        assert model.makespan(plan) == simulate(dag, dag.durations(plan)).makespan
    # group costs above an action's cost: its duration clips at zero in both (the search's own
    # re-timings leave it negative, which shortens the step where the action is critical).
    p1 = make_profile(schedule="1F1B", ranks=2, microbatches=2, groups=3)
    one = build_dag(p1)
    shorter = 0
    for a in one.freezable():
        tight = dataclasses.replace(one, cost={**one.cost, a: 0.01 * one.cost[a]})
        model = FreezeProblem(tight, estimate_signal(p1, opts.sensitivity), opts)
        plan = {k: 1.0 for k in tight.all_frozen() if k[0] == a}
        want = simulate(tight, tight.durations(plan)).makespan
        assert model.makespan(plan) == want
        shorter += model.timer.times(model.timer.durations(plan))[0] < want - 1e-6
    assert shorter > 0


def test_milp_with_cbc_does_not_start_when_its_root_lp_would_outlast_the_deadline() -> None:
    """CBC solves a MILP's root LP before it looks at its time limit (1F1B 16×64 with 8 groups:
    1.3 s left, the MILP took 19.7 s), so `milp` with CBC starts only with as much time left as the
    LP relaxation's phase 1 took through PuLP; HiGHS's array path records no such time."""
    import resource
    import time

    from freezeopt.solver.dive import round_down
    from freezeopt.solver.modes import LpRelaxation
    from freezeopt.solver.search import search

    p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3, seed=1)
    _dag, model = solve_model(p, mode="milp", solver="cbc", budget=0.1)
    lp = LpRelaxation(model)
    _, lp_x = lp.solve(math.inf, write=None)
    pulp_model = lp.pulp_model
    assert 0 < pulp_model.relax_seconds < 60
    start = search(model, round_down(model, lp_x))
    assert pulp_model.no_time_for_milp(time.perf_counter() + 30) is None
    pulp_model.relax_seconds = 45.0  # as if the relaxation had taken 45 s
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    plan, status, notes = pulp_model.solve_milp(start, time.perf_counter() + 30, write=None)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # no CBC was started: no child process used CPU (a run would be reaped and counted)
    assert (after.ru_utime + after.ru_stime) == (children.ru_utime + children.ru_stime)
    assert (plan, status) == (start, "heuristic_fallback")
    assert "CBC re-solves the LP relaxation (45.0 s)" in notes[0]
    _, on_highs = solve_model(p, mode="milp", solver="highs", budget=0.1)
    lp = LpRelaxation(on_highs)
    lp.solve(math.inf, write=None)
    fast = lp.pulp_model
    assert fast.relax_seconds == 0.0
    assert fast.no_time_for_milp(time.perf_counter() + 30) is None
    assert fast.no_time_for_milp(time.perf_counter() + 0.5) == "no time left for the MILP"


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_heuristic_without_time_for_the_lp_answers_from_the_lp_free_start(
    monkeypatch: pytest.MonkeyPatch, schedule: str
) -> None:
    """With no time for the LP (its build would not fit), `heuristic` skips it, searches from the
    rank-balanced start, and reports the rank-load bound, which the LP optimum is not below; a
    failed LP (CBC finding nothing) answers the same way, with no `--fallback` needed."""
    import freezeopt.solver.modes as solve_mod

    p = make_profile(schedule=schedule, ranks=4, microbatches=8, groups=3)
    opts = SolveOptions(mode="heuristic", solver="highs", budget=0.1)
    dag, model = solve_model(p, mode="heuristic", solver="highs", budget=0.1)
    need = rank_needs(model)
    bound = max(rank_bound(model, need), model.makespan(dag.all_frozen()))
    start = balanced_plan(model, need)
    lp = solve(dag, estimate_signal(p, "gns"), replace(opts, mode="lp"))
    assert bound <= lp.lp_bound_ms + 1e-6

    monkeypatch.setattr(solve_mod, "LP_BUILD_PER_TIMER", 1e12)
    monkeypatch.setattr(solve_mod, "RELAX_ITERATIONS", 10**12)  # no first-order relaxation either
    r = solve(dag, estimate_signal(p, "gns"), opts)
    assert r.status == "heuristic_fallback"
    assert any("no time for the LP relaxation" in n for n in r.notes)
    assert r.lp_bound_ms == pytest.approx(bound)
    assert r.lp_bound_ms <= r.predicted_ms <= model.makespan(start) + 1e-9
    assert r.signal_dropped <= 0.1 + 1e-9 and model.fits(r.frozen)
    assert r.gap == pytest.approx((r.predicted_ms - bound) / r.predicted_ms)

    monkeypatch.undo()
    import freezeopt.solver.pulp_model as pulp_model

    monkeypatch.setattr(pulp_model, "run_pulp", lambda *a, **k: "no_solution")
    monkeypatch.setattr(solve_mod, "RELAX_ITERATIONS", 10**12)
    c = solve(dag, estimate_signal(p, "gns"), replace(opts, solver="cbc"))
    assert c.status == "heuristic_fallback" and c.lp_bound_ms == pytest.approx(bound)
    assert any("did not solve" in n for n in c.notes)


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_without_the_lp_the_first_order_relaxation_tightens_the_bound_and_may_start_the_search(
    monkeypatch: pytest.MonkeyPatch, schedule: str
) -> None:
    """LP skipped, time for the relaxation: the bound is the larger of the rank-load bound and
    the relaxation's, still not above the LP optimum; the search starts from the relaxation's
    rounded plan unless the rank-balanced one is faster by more than `RELAXED_WITHIN`, and the
    answer is never slower than the rank-balanced start; the notes say which start."""
    import freezeopt.solver.modes as solve_mod

    p = make_profile(schedule=schedule, ranks=4, microbatches=16, groups=3)
    opts = SolveOptions(mode="heuristic", solver="highs", budget=0.1, time_limit=2.0)
    dag, model = solve_model(p, mode="heuristic", solver="highs", budget=0.1)
    need = rank_needs(model)
    rank = max(rank_bound(model, need), model.makespan(dag.all_frozen()))
    balanced = balanced_plan(model, need)
    lp = solve(dag, estimate_signal(p, "gns"), replace(opts, mode="lp"))
    monkeypatch.setattr(solve_mod, "LP_BUILD_PER_TIMER", 1e12)
    monkeypatch.setattr(solve_mod, "RELAX_ITERATIONS", 0)
    monkeypatch.setattr(solve_mod, "RELAX_ABOVE_GAP", 1.0)  # the start is proven close enough
    q = solve(dag, estimate_signal(p, "gns"), opts)
    assert not any("first-order" in n for n in q.notes) and q.lp_bound_ms == pytest.approx(rank)
    monkeypatch.setattr(solve_mod, "RELAX_ABOVE_GAP", -1.0)
    # a fixed number of iterations rather than as many as the time share allows: the bound's
    # tightness must not hang on how busy the host is
    from freezeopt.solver.relax import relax

    monkeypatch.setattr(
        solve_mod,
        "relax",
        lambda prob, deadline: relax(prob, deadline=math.inf, max_iterations=200),
    )
    r = solve(dag, estimate_signal(p, "gns"), opts)
    assert r.status == "heuristic_fallback"
    assert any("200 iterations of the first-order relaxation" in n for n in r.notes)
    assert rank - 1e-9 <= r.lp_bound_ms <= lp.lp_bound_ms + 1e-6
    if r.lp_bound_ms > rank + 1e-9:
        assert any("the first-order relaxation's bound" in n for n in r.notes)
    assert r.lp_bound_ms > rank + 1e-9 or schedule == "ZBVZeroBubble"  # 1F1B: tighter, measured
    assert r.predicted_ms <= model.makespan(balanced) + 1e-9
    assert r.signal_dropped <= 0.1 + 1e-9 and model.fits(r.frozen)
    (note,) = [n for n in r.notes if "iterations of the first-order relaxation" in n]
    t_rounded = float(note.split("(rounded ")[1].split(" ms")[0])
    t_balanced = float(note.split("rank-balanced ")[-1].split(" ms")[0])
    from_relaxed = t_rounded < t_balanced * (1 + solve_mod.RELAXED_WITHIN) - 1e-9
    assert ("relaxation's plan rounded" in note) == from_relaxed, note


@pytest.mark.parametrize("enabled", [True, False])
def test_solve_pauses_the_collector_and_restores_it(
    monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    """The collector is off while a solve runs and as it was afterwards, also when it fails."""
    import gc

    import freezeopt.solver.modes as solve_module

    dag = build_dag(make_profile())
    sig = estimate_signal(make_profile(), "gns")
    seen: list[bool] = []
    real = solve_module._solve

    def spy(*a, **kw):
        seen.append(gc.isenabled())
        return real(*a, **kw)

    monkeypatch.setattr(solve_module, "_solve", spy)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        solve(dag, sig, SolveOptions(mode="heuristic"))
        assert seen == [False] and gc.isenabled() is enabled
        with pytest.raises(InputError):
            solve(dag, sig[:-1], SolveOptions(mode="heuristic"))  # not the DAG's groups
        assert seen == [False, False] and gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_seconds_in_messages_keep_what_matters() -> None:
    """A floor of 4 ms read "0.0 s" next to a 10 ms limit ("it takes 0.0 s … leaves 0.0 s")."""
    from freezeopt.solver.time_limits import secs as _secs

    assert [_secs(s) for s in (0.0043, 0.25, 3.21, 40.4, 268.0)] == [
        "0.004 s",
        "0.2 s",
        "3.2 s",
        "40 s",
        "268 s",
    ]
