"""LP diving: binary plans within budget and caps, cut short cleanly, and the faster of two dives."""

from __future__ import annotations

import math

import pytest

from freezeopt.model.sensitivity import estimate_signal
from freezeopt.solver import SolveOptions, solve
from freezeopt.solver.modes import LpRelaxation
from tests.conftest import make_profile, solve_model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dive_ends_with_an_integer_plan_that_fits(seed: int) -> None:
    """The dive fixes keys until the LP has no fractional one left: its plan is binary, keeps
    budget and caps, and cannot beat the LP bound. Cut short after the first LP, it is that LP
    rounded down, the heuristic's start (the dive solves with HiGHS, as the model here does); with
    no time for the first LP, it is empty."""
    from freezeopt.solver.dive import dive, round_down
    from freezeopt.solver.problem import Deadline

    p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3, seed=seed)
    cap = 0.3 if seed == 2 else None
    _dag, model = solve_model(p, mode="milp", solver="highs", budget=0.1, stage_cap=cap)
    t1, lp_x = LpRelaxation(model).solve(math.inf, write=None)
    plan = dive(model, Deadline())
    assert plan and set(plan.values()) == {1.0} and model.fits(plan)
    assert model.makespan(plan) >= t1 - 1e-6

    class Passed(Deadline):  # the deadline passes right after the first LP
        def passed(self) -> bool:
            self.hit = True
            return True

    assert dive(model, Passed()) == round_down(model, lp_x)
    assert dive(model, Deadline(0.0)) == {}  # no time for the first LP: no plan


def test_milp_starts_from_the_better_of_rounding_and_diving() -> None:
    """On the first instance the dive finds a faster plan than rounding and the MILP starts from it
    (a note says so); on the second rounding wins and the answer is never slower than it."""
    from freezeopt.solver.dive import dives, round_down
    from freezeopt.solver.problem import Deadline
    from freezeopt.solver.search import search

    for seed, dive_wins in ((1, True), (6, False)):
        p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3, seed=seed)
        dag, model = solve_model(p, mode="milp", solver="highs", budget=0.1)
        lp = LpRelaxation(model)
        _, lp_x = lp.solve(math.inf, write=None)
        rounded = model.makespan(search(model, round_down(model, lp_x)))
        dived = model.makespan(dives(model, lp.take(), Deadline(), Deadline()))
        assert (dived < rounded) == dive_wins
        opts = SolveOptions(mode="milp", budget=0.1, time_limit=30, solver="highs")
        r = solve(dag, estimate_signal(p, opts.sensitivity), opts)
        assert r.predicted_ms <= min(rounded, dived) + 1e-9
        assert any("LP diving" in n for n in r.notes) == dive_wins


def test_milp_dives_twice_and_keeps_the_faster_plan() -> None:
    """With time for both, `dives` dives from the relaxation's own model and from a cold one and
    keeps the faster plan after the search."""
    from freezeopt.solver.dive import dive, dives
    from freezeopt.solver.problem import Deadline
    from freezeopt.solver.search import search

    for seed in (1, 2, 5):
        p = make_profile(schedule="1F1B", ranks=4, microbatches=8, groups=3, seed=seed)
        _dag, model = solve_model(p, mode="milp", solver="highs", budget=0.1)
        relaxation = LpRelaxation(model)
        relaxation.solve(math.inf, write=None)
        lp = relaxation.take()
        assert lp is not None
        taken = model.makespan(search(model, dive(model, Deadline(), lp)))
        cold = model.makespan(search(model, dive(model, Deadline())))
        relaxation.solve(math.inf, write=None)
        best = dives(model, relaxation.take(), Deadline(), Deadline())
        assert model.fits(best)
        assert model.makespan(best) == pytest.approx(min(taken, cold), rel=1e-12), seed
        assert relaxation.take() is None  # the first dive took it
