"""The heuristic's search: its moves keep budget and caps, never lengthen the step, and stop in time."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import freezeopt.solver.search as search_mod
from freezeopt.model.simulate import Timer, simulate
from freezeopt.solver.dive import round_down
from freezeopt.solver.modes import LpRelaxation
from freezeopt.solver.problem import Deadline
from freezeopt.solver.search import KICK, _batch, _fill, _release, _swap, search
from tests.conftest import make_profile, solve_model


def _moved(move, dag, model, plan, *args, **kw):  # type: ignore[no-untyped-def]
    """A search move (`_fill`, `_swap`: they change an array of frozen keys) run on a plan: the
    new plan, or `plan` itself when the move changed nothing."""
    on = model.index.mask(plan)
    return model.index.plan(model, on) if move(dag, model, on, *args, **kw) else plan


def test_swap_moves_frozen_work_onto_the_critical_path_at_the_same_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Freeze each group in the microbatches with the most slack (where it saves least): the swap
    search must move them onto the critical path, keep every count (so the signal), and shorten
    the step."""
    dag, model = solve_model(make_profile(ranks=4, microbatches=8, groups=2), budget=0.3)
    timing = Timer(dag)
    d = timing.durations({})
    span, end, _ = timing.run(d)
    slack = timing.slack(d, end, span)
    plan: dict = {}
    for _sg, keys in sorted(model.by_group.items()):
        by_slack = sorted(keys, key=lambda k: (-slack[timing.idx[k[0]]], str(k[0])))
        plan.update({k: 1.0 for k in by_slack[:2]})
    placed = timing.run(timing.durations(plan))[0]
    out = _moved(_swap, dag, model, plan, 200, timing)
    assert out is not plan
    assert model.counts(out) == model.counts(plan)
    assert model.signal_of(out) == pytest.approx(model.signal_of(plan), abs=1e-15)
    assert simulate(dag, dag.durations(out)).makespan < placed - 1.0
    again = _moved(_swap, dag, model, out, 200, timing)  # a second pass may improve, never worsen
    assert (
        simulate(dag, dag.durations(again)).makespan <= simulate(dag, dag.durations(out)).makespan
    )

    # one move per re-timing keeps the same invariants; the batch path is what made `out` here
    monkeypatch.setattr(search_mod, "BATCH", 1)
    single = _moved(_swap, dag, model, plan, 200, timing)
    assert model.counts(single) == model.counts(plan)
    assert simulate(dag, dag.durations(single)).makespan < placed - 1.0
    assert single != out


@pytest.mark.parametrize("stage_cap", [None, 0.2])
def test_kicks_release_slack_keys_and_keep_only_faster_plans(stage_cap: float | None) -> None:
    """`search` with kicks, no deadline: it ends (each kick that does not help doubles the share
    released, up to `KICK_MAX`), its plan keeps budget and caps, and it is never slower than the
    search without kicks from the same start; `_release` unfreezes the keys with the most slack."""
    p = make_profile(ranks=4, microbatches=16, groups=3)
    _dag, model = solve_model(p, budget=0.1, stage_cap=stage_cap, solver="highs")
    _, lp_x = LpRelaxation(model).solve(math.inf, write=None)
    start = round_down(model, lp_x)
    plain = search(model, start)
    kicked = search(model, start, kicks=True)
    assert model.fits(kicked)
    assert model.makespan(kicked) <= model.makespan(plain) + 1e-9

    ix, timing = model.index, model.timer
    on = ix.mask(plain)
    before = on.copy()
    _release(model, on, KICK)
    gone = np.flatnonzero(before & ~on)
    assert len(gone) == max(1, int(KICK * before.sum())) and not (on & ~before).any()
    d = ix.durations(before)
    span, _, end, _ = timing.times(d)
    slack = timing.slack(d, end, span)
    kept = np.flatnonzero(on)
    assert slack[ix.act[gone]].min() >= slack[ix.act[kept]].max() - 1e-12


def test_swaps_make_the_heuristic_faster_at_the_same_budget() -> None:
    """The heuristic (round, fill, swap, fill) against round and fill alone, from the same LP."""
    p = make_profile(ranks=4, microbatches=16, groups=3)
    dag, model = solve_model(p, budget=0.1, solver="highs")
    _, lp_x = LpRelaxation(model).solve(math.inf, write=None)
    fill_only = _moved(_fill, dag, model, round_down(model, lp_x), 200, Timer(dag))
    heur = search(model, round_down(model, lp_x))
    assert model.fits(heur)
    before = simulate(dag, dag.durations(fill_only)).makespan
    assert simulate(dag, dag.durations(heur)).makespan < before - 1e-6


@pytest.mark.parametrize("stage_cap", [None, 0.2])
def test_cross_group_swaps_keep_budget_and_caps(stage_cap: float | None) -> None:
    """Moves between groups change counts: the budget, group caps and stage caps must still hold
    after them, and no accepted move lengthens the step."""
    p = make_profile(ranks=4, microbatches=8, groups=3)
    dag, model = solve_model(p, budget=0.05, group_cap=0.5, stage_cap=stage_cap)
    timing = Timer(dag)
    rng = random.Random(3)
    moved = 0
    for _ in range(6):  # random plans that fit: frozen wherever, so there is work to move
        plan: dict = {}
        for k in rng.sample(model.keys, len(model.keys)):
            if model.fits({**plan, k: 1.0}):
                plan[k] = 1.0
        out = _moved(_swap, dag, model, plan, 200, timing, cross=True)
        assert model.fits(out)
        before = timing.run(timing.durations(plan))[0]
        assert timing.run(timing.durations(out))[0] <= before
        moved += out is not plan and model.counts(out) != model.counts(plan)
    assert moved, "some move changed the counts"


@pytest.mark.parametrize(
    ("budget", "group_cap", "stage_cap"), [(0.3, 0.75, None), (0.05, 0.5, None), (0.3, 0.75, 0.2)]
)
def test_a_batched_fill_freezes_several_keys_a_retiming_within_budget_and_caps(
    budget: float, group_cap: float, stage_cap: float | None
) -> None:
    """From nothing frozen, the fill with batches, its time short: budget, group caps and stage
    caps hold, the step is shorter, and it froze more keys than it re-timed the DAG (so batches
    were kept). With time enough (no deadline) it freezes one key a try."""

    class Short(Deadline):  # every try finds the time left short, and none is the last
        def expired(self) -> bool:
            return False

        def passed(self) -> bool:
            return False

    p = make_profile(ranks=4, microbatches=16, groups=3)
    dag, model = solve_model(p, budget=budget, group_cap=group_cap, stage_cap=stage_cap)
    timing = Timer(dag)
    calls = 0
    times = timing.times

    def counted(d):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return times(d)

    timing.times = counted  # type: ignore[method-assign]
    out = _moved(_fill, dag, model, {}, 10_000, timing, clock=Short(0.0), batch=16)
    assert model.fits(out)
    assert len(out) > calls, (len(out), calls)
    t0 = model.makespan({})
    assert model.makespan(out) < t0 - 1e-6
    for clock in (None, Deadline()):  # as single keys: within budget and caps, a try a key
        calls = 0
        one = _moved(_fill, dag, model, {}, 10_000, timing, clock=clock, batch=16)
        assert model.fits(one) and len(one) <= calls
        assert one == _moved(_fill, dag, model, {}, 10_000, timing, clock=clock)


def test_a_batch_takes_keys_in_order_while_caps_and_budget_hold_together() -> None:
    """`_batch` counts its own picks: a group's later keys pay its curve's later slopes and stop
    at the group cap, and the stage caps and the budget hold for the batch as a whole."""
    p = make_profile(ranks=2, microbatches=8, groups=2)
    dag, model = solve_model(p, budget=0.2, group_cap=0.5, stage_cap=0.4)
    ix = model.index
    _, signal, _, cap = model.tally(np.zeros(len(ix.sg), dtype=bool))
    count = np.zeros(len(ix.pairs), dtype=np.int64)
    load = np.zeros(dag.n_stages)
    ranked = np.arange(len(model.keys))  # every key, in key order
    chosen, added, sig = _batch(model, ranked, count, load, signal, cap, len(model.keys))
    plan = {model.keys[i]: 1.0 for i in chosen}
    assert chosen == sorted(chosen) and len(chosen) > 1
    assert model.fits(plan)
    assert sig == pytest.approx(model.signal_of(plan))
    assert sum(added.values()) == len(chosen)
    for k, a in added.items():
        assert a == sum(ix.sg_id[i] == k for i in chosen) and a <= model.kmax
    # nothing left out of the batch would still fit beside it
    left = [model.keys[i] for i in range(len(model.keys)) if i not in set(chosen)]
    assert all(not model.fits({**plan, k: 1.0}) for k in left)
    few, _, _ = _batch(model, ranked, count, load, signal, cap, 3)
    assert few == chosen[:3]


def test_the_search_clock_stops_before_a_try_would_end_past_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tries of 50 ms against a deadline at 0.26 s: the clock stops after the fifth try (0.25 s)
    rather than start a sixth that would end at 0.30 s; `expired` and the time before
    `start_search` do not count as tries."""
    now = [0.0]
    monkeypatch.setattr(search_mod.time, "perf_counter", lambda: now[0])
    clock = Deadline(0.26)
    assert not clock.expired()
    now[0] = 0.2  # set-up before the search, not a try
    clock.start_search()
    now[0] = 0.0
    clock.start_search()
    tries = 0
    while not clock.passed():
        tries += 1
        now[0] += 0.05
    assert tries == 5 and clock.hit and now[0] == pytest.approx(0.25)
    # a clock that only expires: past `at` and not before
    late = Deadline(0.3)
    assert not late.expired() and not late.hit
    now[0] = 0.31
    assert late.expired() and late.passed()
