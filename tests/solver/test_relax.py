"""The first-order relaxation: its bound never exceeds the LP optimum, its plan keeps the budget
and caps, its linear step is the exact knapsack, and given iterations it closes on the LP."""

from __future__ import annotations

import itertools
import math
import types

import numpy as np
import pulp
import pytest

from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.model.simulate import Timer
from freezeopt.solver import FreezeProblem, SolveOptions
from freezeopt.solver.lp_arrays import FastLP
from freezeopt.solver.relax import Relaxation, _Knapsack, relax
from tests.conftest import SHAPES, make_profile

CASES = [
    (schedule, ranks, mbs, groups, seed)
    for (schedule, ranks, mbs), groups, seed in itertools.product(SHAPES, (1, 3), (0, 1))
]


def _model(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, **kw: object
) -> FreezeProblem:
    p = make_profile(schedule=schedule, ranks=ranks, microbatches=mbs, groups=groups, seed=seed)
    opts = SolveOptions(**kw)  # type: ignore[arg-type]
    return FreezeProblem(build_dag(p), estimate_signal(p, opts.sensitivity), opts)


def _relax(m: FreezeProblem, iterations: int = 100_000, deadline: float = math.inf) -> Relaxation:
    return relax(m, deadline=deadline, max_iterations=iterations)


def _knapsack(m: FreezeProblem) -> _Knapsack:
    return _Knapsack(
        m.dag,
        m.timer,
        m.by_group,
        m.loss,
        m.kmax,
        m.opts.budget,
        m.stage_share,
        m.stage_load_cap,
    )


def _lp(m: FreezeProblem) -> float:
    lp = FastLP(
        m.dag,
        keys=m.keys,
        loss=m.loss,
        kmax=m.kmax,
        budget=m.opts.budget,
        stage_cap=m.opts.stage_cap,
        tolerance=0.0,
    )
    return lp.solve(time_limit=60).t1


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_the_soft_passes_edges_leave_every_plans_step_time_as_it_is(schedule: str) -> None:
    """The edges left out for the soft passes (`_soft_edges`) are implied: over the rest every
    action ends when it does over all edges, for plans from nothing to everything frozen, with
    the profile's lags and with random ones; some are left out."""
    from freezeopt.model.simulate import _passes as hard_passes
    from freezeopt.solver.relax import _soft_edges

    m = _model(schedule, 4, 8, 3, 0)
    forward, *_ = hard_passes()
    rng = np.random.default_rng(0)
    timer = m.timer
    for lags in ("profiled", "random"):
        if lags == "random":  # random lags on all but program-order edges: the lag test counts
            ptr, src, lag = m.timer._pred
            timer = Timer(m.dag)
            at = {
                a: (r, i) for r, acts in enumerate(m.dag.rank_actions) for i, a in enumerate(acts)
            }
            dst = np.repeat(np.arange(len(timer.order)), np.diff(ptr))
            ru, iu = zip(*(at[timer.order[u]] for u in src), strict=True)
            rv, iv = zip(*(at[timer.order[v]] for v in dst), strict=True)
            order = (np.array(ru) == rv) & (np.array(iv) - iu == 1)
            big = rng.uniform(0, 5 * timer.base.mean(), len(lag))
            timer._pred = (ptr, src, np.where(order, lag, big))
        ptr, src, lag = _soft_edges(m.dag, timer)
        assert len(src) < len(timer._pred[1])
        for share in (0.0, 0.3, 1.0, *rng.random(5)):
            pick = rng.random(len(m.keys)) < share
            plan = {k: float(v) for k, v in zip(m.keys, pick, strict=True)}
            d = np.maximum(timer.durations(plan), 0.0)
            _, end, _ = forward(d, ptr, src, lag)
            np.testing.assert_allclose(end, timer.times(d)[2], rtol=1e-12)


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_the_backward_pass_gives_the_soft_step_times_gradient(schedule: str) -> None:
    """The weights `p` of the backward pass (from the edge shares the forward pass keeps) are the
    derivatives of the smoothed step time by each duration (central differences), over all edges
    (soft maxima of three terms by `exp` and `log`) and over the kept ones (two terms: the table),
    and the path distribution they describe has a mean length between the step time and its
    smoothed value. The forward pass gives the same smoothed step time whether it keeps the shares
    or not."""
    from freezeopt.solver.relax import _passes, _soft_edges
    from freezeopt.solver.relax_kernels import SOFTPLUS as _SOFTPLUS

    fwd, bwd, *_ = _passes()
    m = _model(schedule, 3, 6, 1, 0)
    rng = np.random.default_rng(0)
    n = len(m.timer.order)
    d = m.timer.base * rng.uniform(0.5, 1.5, n)
    hard = m.timer.times(d)[0]

    def span(d: np.ndarray, w: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        kept = np.empty(0) if w is None else w
        s, _, end = fwd(d, ptr, src, lag, sinks, tau, kept, *_SOFTPLUS)
        return s, end

    for ptr, src, lag in (m.timer._pred, _soft_edges(m.dag, m.timer)):
        assert np.diff(ptr).max() == (3 if len(src) == len(m.timer._pred[1]) else 2)
        sinks = np.flatnonzero(np.bincount(src, minlength=n) == 0).astype(np.int64)
        for tau in (0.02 * hard, 0.002 * hard):
            w = np.empty(len(src))
            t, end = span(d, w)
            assert span(d)[0] == t
            p, elag = bwd(end, t, ptr, src, lag, sinks, tau, w)
            h = 1e-5 * hard
            for a in range(n):
                up, down = d.copy(), d.copy()
                up[a] += h
                down[a] -= h
                slope = (span(up)[0] - span(down)[0]) / (2 * h)
                assert p[a] == pytest.approx(slope, abs=1e-6), m.timer.order[a]
            assert hard - 1e-9 <= t
            assert float(p @ d) + elag <= hard + 1e-9


def test_the_softplus_table_is_within_its_stated_error() -> None:
    """The soft maximum's table gives `log(1 + exp(−z))` within 3.2e-10 and the smaller term's
    share within 3.1e-8 for z from 0 to past its end (0 there), and the share is the slope of the
    value it gives (central differences)."""
    from freezeopt.solver.relax import _passes
    from freezeopt.solver.relax_kernels import SOFTPLUS as _SOFTPLUS
    from freezeopt.solver.relax_kernels import SOFTPLUS_TO

    softplus = _passes()[5]
    for z in np.concatenate([np.linspace(0, SOFTPLUS_TO + 2, 20011), [1e-12, 39.999999]]):
        f, q = softplus(z, *_SOFTPLUS)
        want = math.log1p(math.exp(-z)) if z < SOFTPLUS_TO else 0.0
        share = math.exp(-z) / (1 + math.exp(-z)) if z < SOFTPLUS_TO else 0.0
        assert abs(f - want) <= 3.2e-10 and abs(q - share) <= 3.1e-8, z
        if 1e-3 < z < SOFTPLUS_TO - 1e-3:
            h = 1e-5
            slope = (softplus(z + h, *_SOFTPLUS)[0] - softplus(z - h, *_SOFTPLUS)[0]) / (2 * h)
            assert -slope == pytest.approx(q, abs=1e-9), z


@pytest.mark.parametrize(("schedule", "ranks", "mbs", "groups", "seed"), CASES)
@pytest.mark.parametrize(("budget", "stage_cap"), [(0.05, None), (0.3, None), (0.3, 0.4)])
def test_bound_never_exceeds_the_lp_optimum_and_the_plan_keeps_budget_and_caps(
    schedule: str, ranks: int, mbs: int, groups: int, seed: int, budget: float, stage_cap: float
) -> None:
    m = _model(schedule, ranks, mbs, groups, seed, budget=budget, stage_cap=stage_cap)
    t_lp = _lp(m)
    r = _relax(m, 150)
    assert r.iterations == 150
    assert r.bound <= t_lp * (1 + 1e-9) + 1e-9
    assert r.bound > 0.5 * m.makespan({})  # a bound worth reporting, not a trivial one
    assert m.fits(r.plan)  # fractional counts: budget by the loss curves' linear pieces, caps
    assert all(0.0 < v <= 1.0 + 1e-12 for v in r.plan.values())
    assert r.makespan == pytest.approx(m.makespan(r.plan), rel=1e-12)
    assert r.makespan >= t_lp * (1 - 1e-9) - 1e-9  # a plan the LP allows is no faster than it


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_given_iterations_it_closes_on_the_lp_optimum(schedule: str) -> None:
    m = _model(schedule, 4, 16, 3, 0, budget=0.1)
    t_lp = _lp(m)
    r = _relax(m, 3000)
    assert t_lp * (1 - 0.01) <= r.bound <= t_lp * (1 + 1e-9)
    assert t_lp * (1 - 1e-9) <= r.makespan <= t_lp * (1 + 0.01)
    base = m.makespan({})
    assert r.makespan < base - 0.5 * (base - t_lp)  # most of the LP's speed-up, fractional


@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_a_hundred_iterations_take_nearly_all_of_the_lp_speed_up(schedule: str) -> None:
    """The step length minimises `T_τ` along each step: after 100 iterations the fractional plan
    misses under 3.5 % of the LP's speed-up (measured 0.50, 2.58, 2.07 % with the gradients' moving
    average, `relax.MOMENTUM`; before it, 1.5, 4.65, 3.7 % with a trial pass every other iteration,
    `relax.TRIAL_EVERY`; 1.4, 3.3, 3.4 % with one every iteration, 1.6, 6.2, 4.5 % with the untried
    steps capped at twice the last instead of once; backtracking took 1.8, 3.2, 5.8 %, and steps a
    tenth as long 9.7, 21, 31 %)."""
    m = _model(schedule, 4, 16, 3, 0, budget=0.1)
    t_lp, base = _lp(m), m.makespan({})
    r = _relax(m, 100)
    assert r.makespan - t_lp <= 0.035 * (base - t_lp)


def test_the_same_iterations_give_the_same_answer() -> None:
    m = _model("Interleaved1F1B", 2, 8, 3, 1, budget=0.2)
    a, b = _relax(m, 200), _relax(m, 200)
    assert a == b


def test_it_stops_by_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that moves 10 ms at every reading (one reading an iteration, two more after the
    first): it runs while the next iteration, at the pace so far, ends by the deadline — and no
    further."""
    import freezeopt.solver.relax as relax_mod

    m = _model("1F1B", 4, 16, 3, 0, budget=0.1)
    _relax(m, 1)  # the kernels compiled and loaded before the clock is replaced
    reads: list[float] = []

    def clock() -> float:
        reads.append(0.01 * len(reads))
        return reads[-1]

    monkeypatch.setattr(relax_mod, "time", types.SimpleNamespace(perf_counter=clock))
    r = _relax(m, deadline=0.3)
    monkeypatch.undo()
    pace = (reads[-1] - reads[0]) / r.iterations  # the pace at the check that stopped it
    assert 0 < r.iterations < 30
    assert reads[-1] + pace > 0.3  # the next one would have ended past the deadline
    assert reads[-2] + (reads[-2] - reads[0]) / (r.iterations - 1) <= 0.3 + 1e-12  # this one fitted


def test_nothing_to_freeze_gives_the_unfrozen_step_as_the_bound() -> None:
    m = _model("1F1B", 2, 4, 2, 0, budget=0.1, group_cap=0.0)
    r = _relax(m, 10)
    assert r.plan == {} and r.iterations == 0
    assert r.bound == pytest.approx(m.makespan({})) == pytest.approx(r.makespan)


@pytest.mark.parametrize(("seed", "stage_cap"), [(0, None), (1, None), (2, 0.3), (3, 0.6)])
def test_the_linear_step_is_the_exact_knapsack(seed: int, stage_cap: float | None) -> None:
    """For random action weights, the knapsack's plan and value equal an LP posed in PuLP (counts,
    the convex loss by its linear pieces, budget, group and stage caps); without stage caps its
    second value is that LP's with the caps left out."""
    m = _model("ZBVZeroBubble", 2, 8, 3, seed, budget=0.15, stage_cap=stage_cap)
    ks = _knapsack(m)
    rng = np.random.default_rng(seed)
    p = rng.random(len(m.timer.order))
    p[rng.random(len(p)) < 0.3] = 0.0  # off every path: freezing there saves nothing
    x, value, value_free, saved = ks.solve(p)
    idx = m.timer.idx
    # the time saved per action, as the kernel sums it, is the plan's
    want = np.bincount(ks.key_act, weights=ks.key_c * x, minlength=len(p))
    np.testing.assert_allclose(saved, want, rtol=1e-12, atol=1e-12)

    def lp(capped: bool) -> float:
        prob = pulp.LpProblem("linear_step", pulp.LpMaximize)
        xv = {k: prob.add_variable(f"x_{i}", 0, 1) for i, k in enumerate(ks.keys)}
        ell = {sg: prob.add_variable(f"l_{sg[0]}_{sg[1]}", 0) for sg in m.by_group}
        gain = [p[idx[a]] * m.dag.group_cost[a.stage][g] * v for (a, g), v in xv.items()]
        prob += pulp.lpSum(gain)
        for sg, keys in m.by_group.items():
            k = pulp.lpSum(xv[key] for key in keys)
            prob += k <= m.kmax, f"kmax_{sg[0]}_{sg[1]}"
            loss = m.loss[sg]
            for j in range(m.kmax):
                prob += ell[sg] >= loss[j] + (loss[j + 1] - loss[j]) * (k - j), f"p_{sg}_{j}"
        prob += pulp.lpSum(ell.values()) <= m.opts.budget, "budget"
        if capped and m.opts.stage_cap is not None:
            for s in {s for s, _ in m.by_group}:
                load = [
                    m.stage_share[sg] * xv[key]
                    for sg, keys in m.by_group.items()
                    if sg[0] == s
                    for key in keys
                ]
                prob += pulp.lpSum(load) <= m.opts.stage_cap * m.dag.n_microbatches, f"cap_{s}"
        prob.solve(pulp.HiGHS(msg=False))
        assert pulp.LpStatus[prob.status] == "Optimal"
        return float(pulp.value(prob.objective))

    plan = {k: float(v) for k, v in zip(ks.keys, x, strict=True) if v > 0}
    assert m.fits(plan)
    got = sum(p[idx[a]] * m.dag.group_cost[a.stage][g] * v for (a, g), v in plan.items())
    assert got == pytest.approx(value, rel=1e-9, abs=1e-9)
    assert value_free == pytest.approx(lp(capped=False), rel=1e-7, abs=1e-7)
    if stage_cap is None:
        assert value == pytest.approx(value_free)
    else:  # greedy within stage caps: feasible, not always the capped optimum, never above it
        assert value <= lp(capped=True) + 1e-7 <= value_free + 2e-7


def _sorted_greedy(ks: _Knapsack, p: np.ndarray, stage_room: np.ndarray) -> np.ndarray:
    """The linear step as the module docstring words it, by sorting: each group's keys by
    benefit (stable: step order breaks ties), every unit by time saved per signal (stable: group,
    then segment), then greedily within budget and stage caps."""
    b = np.append(p[ks.key_act] * ks.key_c, -1.0)[ks.mat]  # pads: −1
    order = np.argsort(-b, axis=1, kind="stable")[:, : ks.kmax]
    top = np.take_along_axis(b, order, axis=1).ravel()
    which = np.take_along_axis(ks.mat, order, axis=1).ravel()
    slope = ks.slope.ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(slope > 0, top / slope, np.inf)
    ratio[top <= 0] = -1.0
    group = np.repeat(np.arange(len(ks.size)), ks.kmax)
    x, room, load = np.zeros(len(ks.keys)), ks.room, np.zeros(len(stage_room))
    for u in np.argsort(-ratio, kind="stable"):
        if ratio[u] <= 0 or room <= 0:
            break
        s, share = ks.group_stage[group[u]], ks.group_share[group[u]]
        if load[s] + share > stage_room[s]:
            continue
        amount = min(1.0, room / slope[u]) if slope[u] > 0 else 1.0
        room -= amount * slope[u] if slope[u] > 0 else 0.0
        x[which[u]] = amount
        load[s] += amount * share
    return x


@pytest.mark.parametrize(("schedule", "stage_cap"), [("1F1B", None), ("ZBVZeroBubble", 0.3)])
def test_the_linear_step_takes_units_in_sorted_order(
    schedule: str, stage_cap: float | None
) -> None:
    """The heap merge gives exactly the plan of sorting every key and unit, ties included (equal
    weights go to the earlier microbatches); so does the threshold (`_Knapsack.free`, what runs
    without stage caps) without stage caps, but for the rounding of one amount."""
    m = _model(schedule, 4, 16, 3, 0, budget=0.2, stage_cap=stage_cap)
    ks = _knapsack(m)
    assert len(ks.osize) == len({s for s, _ in m.by_group})  # a stage's groups share one order
    rng = np.random.default_rng(0)
    for trial in range(60):
        p = rng.random(len(m.timer.order))
        if trial % 2:
            p = np.round(p * 3) / 3  # many ties
        if trial % 3 == 0:
            p[rng.random(len(p)) < 0.5] = 0.0
        x, *_, saved = ks.solve(p)
        _assert_same_plan(x, _sorted_greedy(ks, p, ks.capped), exact=stage_cap is not None)
        want = np.bincount(ks.key_act, weights=ks.key_c * x, minlength=len(p))
        np.testing.assert_allclose(saved, want, rtol=1e-12, atol=1e-12)
        no_caps = np.full(len(ks.capped), np.inf)
        _assert_same_plan(ks.free(p)[0], _sorted_greedy(ks, p, no_caps), exact=False)
    x, *_ = ks.solve(np.ones(len(m.timer.order)))  # all tied: each group's first microbatches
    for sg, keys in m.by_group.items():
        taken = sorted(k[0].microbatch for k in keys if x[ks.keys.index(k)] > 0)
        assert taken == list(range(len(taken))), sg


def test_groups_with_different_actions_keep_their_own_order() -> None:
    """Where a stage's groups do not hold the same actions (not from `FreezeProblem`, but allowed), each
    group's keys are ordered on their own, and the plan is still the sorted greedy's."""
    m = _model("1F1B", 4, 16, 3, 0, budget=0.2)
    by_group = {sg: list(keys) for sg, keys in m.by_group.items()}
    for i, sg in enumerate(sorted(by_group)):
        if i % 2:
            del by_group[sg][i % len(by_group[sg])]  # every other group loses one microbatch
    ks = _Knapsack(
        m.dag,
        m.timer,
        by_group,
        m.loss,
        m.kmax,
        m.opts.budget,
        m.stage_share,
        m.stage_load_cap,
    )
    assert len(ks.osize) > len({s for s, _ in by_group})
    rng = np.random.default_rng(1)
    for trial in range(40):
        p = rng.random(len(m.timer.order))
        if trial % 2:
            p = np.round(p * 3) / 3
        x, *_ = ks.solve(p)
        _assert_same_plan(x, _sorted_greedy(ks, p, ks.capped), exact=False)


def _assert_same_plan(x: np.ndarray, want: np.ndarray, *, exact: bool) -> None:
    """The same keys taken; the same amounts, exactly (the heap merge) or but for the rounding of
    the room left (`_Knapsack.free` sums it in another order): amounts off by under 1e-12, keys
    taken by one of them only with amounts under 1e-12 (what a room of a few ulps buys)."""
    if exact:
        np.testing.assert_array_equal(x, want)
        return
    np.testing.assert_array_equal(x > 1e-12, want > 1e-12)
    np.testing.assert_allclose(x, want, rtol=0, atol=1e-12)


def _reference_rounding(m: FreezeProblem, x: dict, sure: float | None) -> dict:
    """The rounding `Relaxation.rounded` tries, written over dicts: per group the count rounded
    down; by extent (ties: the earlier microbatch) when `sure` is None, else the keys at `sure` or
    more kept and the rest of the count spread in step order in proportion to the extents."""
    plan = {}
    for _sg, keys in sorted(m.by_group.items()):
        keys = sorted(keys, key=lambda k: (k[0].microbatch, k[0].kind))
        n = min(math.floor(sum(x.get(k, 0.0) for k in keys) + 1e-6), m.kmax)
        top = sorted(keys, key=lambda k: -x.get(k, 0.0))[:n]  # stable: earlier microbatch first
        if sure is None:
            plan.update(dict.fromkeys(top, 1.0))
            continue
        kept = [k for k in top if x.get(k, 0.0) >= sure]
        plan.update(dict.fromkeys(kept, 1.0))
        rest = [0.0 if k in kept else x.get(k, 0.0) for k in keys]
        left, mass, acc = n - len(kept), sum(rest), 0.0
        for k, v in zip(keys, rest, strict=True):
            if left <= 0 or mass <= 0:
                break
            before, acc = acc, acc + v
            if math.floor(acc * (n - len(kept)) / mass + 0.5) > math.floor(
                before * (n - len(kept)) / mass + 0.5
            ):
                plan[k] = 1.0
                left -= 1
    return plan


@pytest.mark.parametrize(("schedule", "ranks", "mbs", "groups", "seed"), CASES)
@pytest.mark.parametrize(("budget", "stage_cap", "iterations"), [(0.05, None, 7), (0.3, 0.4, 40)])
def test_the_rounded_plan_is_the_fastest_of_its_roundings_in_whole_microbatches(
    schedule: str,
    ranks: int,
    mbs: int,
    groups: int,
    seed: int,
    budget: float,
    stage_cap: float | None,
    iterations: int,
) -> None:
    """Whole microbatches, each group's count its fractional count rounded down, within budget
    and caps; the rounding the simulator times fastest among those tried (so never slower than
    rounding down by extent)."""
    m = _model(schedule, ranks, mbs, groups, seed, budget=budget, stage_cap=stage_cap)
    r = _relax(m, iterations)
    assert set(r.rounded.values()) <= {1.0} and m.fits(r.rounded)
    counts, fractional = m.counts(r.rounded), m.counts(r.plan)
    assert all(counts.get(sg, 0) == math.floor(k + 1e-6) for sg, k in fractional.items())
    tries = [_reference_rounding(m, r.plan, sure) for sure in (None, 0.5, 0.7, 0.9)]
    assert r.rounded in tries
    fastest = min(m.makespan(p) for p in tries if m.fits(p))
    assert m.makespan(r.rounded) == pytest.approx(fastest, rel=1e-12)


def test_rounding_an_over_budget_plan_drops_the_dearest_units_until_it_fits() -> None:
    """Rounding down a feasible plan can break the budget only by numerical drift; the guard is
    checked on a plan far over it (everything frozen)."""
    from freezeopt.solver.relax import _round

    m = _model("1F1B", 4, 16, 3, 0, budget=0.05)
    ks, t = _knapsack(m), m.timer
    n = len(t.order)

    def hard(x: np.ndarray) -> float:
        return t.times(t.base - np.bincount(ks.key_act, weights=ks.key_c * x, minlength=n))[0]

    whole = _round(ks, np.ones(len(ks.keys)), hard)
    plan = {ks.keys[i]: 1.0 for i in np.flatnonzero(whole).tolist()}
    assert plan and m.fits(plan)
    dearest = max(b - a for curve in m.loss.values() for a, b in itertools.pairwise(curve))
    assert m.signal_of(plan) > m.opts.budget - dearest  # it stopped as soon as the plan fitted
