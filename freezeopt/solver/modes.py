"""What to freeze, where: one solve of a `FreezeProblem`, its time limit shared between strategies.

The problem (`freezeopt.solver.problem`) and its PuLP model (`freezeopt.solver.pulp_model`) say
what is optimised: the step time first, then the signal dropped at that step time, under the
budget, the group caps and an optional stage cap. This module decides how to answer within
`time_limit`:

- `lp`: the continuous relaxation (with one group per stage, `flat` sensitivity, no budget and a
  per-stage cap it is TimelyFreeze's LP). With HiGHS it goes to the solver as arrays
  (`freezeopt.solver.lp_arrays`, the same optimum without PuLP objects, re-solved warm from an
  `LpCache` in re-plans); with CBC through the PuLP model.
- `heuristic`: the LP's plan rounded down per group (`freezeopt.solver.dive.round_down`), then the
  search (`freezeopt.solver.search`). The LP gets `LP_SHARE` of the time, none where it cannot
  fit (`freezeopt.solver.time_limits`); without it, the search starts from the rank-balanced
  plan (`freezeopt.solver.balance`) or, with time for it, the first-order relaxation's rounded
  plan (`freezeopt.solver.relax`), and the reported bound is theirs, not the LP's.
- `milp`: the heuristic's plan and the LP dives' (`freezeopt.solver.dive`), the better one warm-
  starting both MILP phases. CBC checks its limit rarely inside the root node, so no MILP starts
  with less time left than the relaxation took; HiGHS's MIP phase 2 runs in a child process
  killed at the deadline (`freezeopt.solver.highs_child`).

`milp` and `lp` need the LP: where its floor exceeds the time left they fail before starting it
(`LpUnsolved`), and with `fallback="heuristic"` they answer as `heuristic` does without the LP.
Every mode reports the no-freeze step time, the all-frozen floor, the LP bound (or the bound the
answer came with) and the step time the list-scheduling simulator gives for the answer.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pulp

from freezeopt.errors import InputError, LpUnsolved, SolverError
from freezeopt.model.dag import PipelineDag
from freezeopt.solver.balance import balanced_plan, rank_bound, rank_needs
from freezeopt.solver.dive import dives, round_down
from freezeopt.solver.lp_arrays import FastLP, LpCache
from freezeopt.solver.problem import (
    Deadline,
    FreezeProblem,
    Key,
    Signal,
    SolveOptions,
    SolveResult,
    Spent,
)
from freezeopt.solver.pulp_model import PulpModel
from freezeopt.solver.relax import Relaxation, relax
from freezeopt.solver.search import FILL_BATCH, load_search_kernels, search
from freezeopt.solver.time_limits import (
    LP_BUILD_PER_TIMER,
    LP_FLOOR_SHARE,
    LP_SHARE,
    RELAX_ABOVE_GAP,
    RELAX_ITERATIONS,
    RELAX_SECONDS_PER_ACTION,
    RELAX_SHARE,
    RELAXED_WITHIN,
    ROUND_SECONDS_PER_KEY,
    SOLVER_NAME,
    WRAP_UP,
    lp_floor,
    more_time,
    seconds_left,
    secs,
)

__all__ = ["LpRelaxation", "load_kernels", "solve"]

WITHOUT_LP = "or answer without the LP: --mode heuristic, or --fallback heuristic"
"""What an LP failure's message ends with where the options do not already allow for it."""


def solve(
    dag: PipelineDag,
    signal: Signal,
    opts: SolveOptions,
    *,
    lp_cache: LpCache | None = None,
) -> SolveResult:
    """Decide what to freeze in `dag` under `opts`; see the module docstring.

    `lp_cache` (HiGHS only): keep the LP relaxation there and re-solve it warm, from the last
    basis, when the next call differs only in costs — what online re-planning does.

    Python's garbage collector is paused for the call (see `_collector_paused`)."""
    with _collector_paused():
        return _solve(dag, signal, opts, lp_cache=lp_cache)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the garbage collector, then restore it as it was. A solve makes hundreds of
    thousands of small objects (key lists, index arrays, plans) beside a DAG of millions, and each
    full collection walks them all; it frees no cycles a solve makes (none are made). At 64×256
    the pause decides whether the relaxation has time to run at all with `--time-limit 2`
    (docs/solver.md). The pause is process-wide, so a solve never runs in a training process
    (re-plans have their own, `freezeopt.training.replan_worker`)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class LpRelaxation:
    """The LP relaxation of one solve: through PuLP with CBC, as arrays into HiGHS otherwise; the
    solved HiGHS model is kept for the LP dive to take over (unless it lives in a shared cache).

    `pulp_model` is the solve's PuLP driver (its time accounting, and `--write-model`); a fresh
    one by default."""

    def __init__(
        self,
        problem: FreezeProblem,
        pulp_model: PulpModel | None = None,
        lp_cache: LpCache | None = None,
    ):
        self.problem, self.lp_cache = problem, lp_cache
        self.pulp_model = pulp_model if pulp_model is not None else PulpModel(problem, Spent())
        self._spare: FastLP | None = None

    def solve(self, deadline: float, *, write: Path | None) -> tuple[float, dict[Key, float]]:
        """Both phases; returns (phase-1 T, phase-2 x). With HiGHS, `write` writes the PuLP models
        of both phases beside the array path's answer."""
        if self.problem.opts.solver != "highs" or self.problem.dag.has_truncation:
            # the arrays hold no truncation rows: a DAG with truncation goes through PuLP
            return self.pulp_model.solve_lp(deadline, write=write)
        if not pulp.HiGHS().available():
            raise SolverError("HiGHS is not available: pip install highspy, or use --solver cbc")
        spent = self.pulp_model.spent
        cache = self.lp_cache if self.lp_cache is not None else LpCache()
        t0 = time.perf_counter()
        try:
            ans, build_s = cache.solve(self.problem, time_limit=seconds_left(deadline))
        except SolverError:
            spent.solver += time.perf_counter() - t0
            raise
        spent.build += build_s
        spent.solver += time.perf_counter() - t0 - build_s
        if self.lp_cache is None:  # a model of this solve alone: the dive may take it over
            self._spare = cache.take()
        if write is not None:
            m = self.pulp_model
            m.write(m.build(integer=False, t_max=None)[0], write, phase=1)
            m.write(m.build(integer=False, t_max=m.t_limit(ans.t1))[0], write, phase=2)
        return ans.t1, ans.x

    def take(self) -> FastLP | None:
        """The solved HiGHS model, for the caller to change; None when the LP was not solved that
        way or lives in a shared `LpCache` (re-plans re-solve it warm)."""
        lp, self._spare = self._spare, None
        return lp


@dataclass(slots=True)
class _WithoutLp:
    """Where the search starts when the LP is out of reach, and the bound the answer comes with."""

    start: dict[Key, float]
    bound: float
    balanced: dict[Key, float]
    t_balanced: float
    notes: list[str]


def _solve(
    dag: PipelineDag, signal: Signal, opts: SolveOptions, *, lp_cache: LpCache | None
) -> SolveResult:
    _check_options(dag, signal, opts)
    mode = opts.mode
    t0 = time.perf_counter()
    # the solvers and the search stop a little early: reading their answer back and re-timing it
    # takes 15–70 ms at 16×64 with 8 groups, and the whole solve should end by the time limit
    deadline = t0 + opts.time_limit - min(WRAP_UP, 0.05 * opts.time_limit)
    problem = FreezeProblem(dag, signal, opts)
    spent = Spent()
    pulp_model = PulpModel(problem, spent)
    lp = LpRelaxation(problem, pulp_model, lp_cache)
    baseline = problem.makespan({})
    timer_seconds = time.perf_counter() - t0
    floor = problem.timer.times(np.maximum(problem.timer.floor, 0.0))[0]  # all frozen
    notes: list[str] = []

    # the heuristic gives the LP LP_SHARE of its time; the search from the LP-free start, the rest
    lp_deadline = deadline if mode != "heuristic" else t0 + LP_SHARE * (deadline - t0)
    failure = _lp_out_of_reach(problem, lp_deadline, timer_seconds)
    lp1, lp_x = math.inf, dict[Key, float]()
    if failure is None:
        try:
            lp1, lp_x = lp.solve(lp_deadline, write=opts.write_model if mode != "milp" else None)
        except SolverError as e:
            failure = e
    without: _WithoutLp | None = None
    if failure is not None:
        if opts.fallback != "heuristic" and mode != "heuristic":
            if isinstance(failure, LpUnsolved):
                raise LpUnsolved(f"{failure}; {WITHOUT_LP}") from None
            raise failure
        without = _answer_without_lp(problem, floor, deadline, failure)
        lp1 = without.bound
        notes.extend(without.notes)
        opts = replace(opts, mode="heuristic")

    predicted: float | None = None  # the answer's step time, where it is known already
    if opts.mode == "lp":
        frozen, status = lp_x, "optimal"
    else:
        clock = Deadline(deadline)
        if without is None:
            frozen = search(
                problem, round_down(problem, lp_x), clock, kicks=opts.mode == "heuristic"
            )
        else:
            frozen = search(problem, without.start, clock, batch=FILL_BATCH, kicks=True)
            predicted = problem.makespan(frozen)
            if predicted > without.t_balanced:  # never slower than the rank-balanced start
                frozen, predicted = without.balanced, without.t_balanced
        status = "heuristic_fallback" if without is not None else "heuristic"
        if clock.hit:
            notes.append(
                "the heuristic's search stopped at the time limit with the best plan so far "
                "(raise --time-limit for a better one)"
            )
        if opts.mode == "milp":
            if not clock.hit:
                frozen = _dived(problem, pulp_model, lp, frozen, deadline, clock, notes)
            frozen, status, milp_notes = pulp_model.solve_milp(
                frozen, deadline, write=opts.write_model
            )
            notes.extend(milp_notes)
            predicted = None
    if predicted is None:
        predicted = problem.makespan(frozen)
    lp_bound = min(lp1, predicted)
    if opts.write_model is not None and not pulp_model.wrote_model:
        why = "the answer came without the LP" if without is not None else "no time for the MILP"
        notes.append(
            f"--write-model: nothing written ({why}); raise --time-limit, or write the LP with "
            "--mode lp"
        )
    return SolveResult(
        status=status,
        mode=mode,
        solver=opts.solver,
        baseline_ms=baseline,
        all_frozen_ms=floor,
        lp_bound_ms=lp_bound,
        predicted_ms=predicted,
        gap=(predicted - lp_bound) / predicted if predicted > 0 else 0.0,
        signal_dropped=problem.signal_of(frozen),
        solve_seconds=time.perf_counter() - t0,
        frozen={k: v for k, v in sorted(frozen.items(), key=_by_key) if v > 1e-9},
        budget=opts.budget,
        notes=tuple(notes),
        bound_from_lp=without is None,
        timings={
            "build": spent.build,
            "solver": spent.solver,
            "other": time.perf_counter() - t0 - spent.build - spent.solver,
        },
    )


def _lp_out_of_reach(
    problem: FreezeProblem, lp_deadline: float, timer_seconds: float
) -> SolverError | None:
    """Why the LP is not even started (its floor says it cannot or would most likely not finish
    in the time it gets), or None when it is worth trying."""
    dag, opts = problem.dag, problem.opts
    lp_left = seconds_left(lp_deadline)
    at_least = lp_floor(dag, opts.solver)
    takes = (
        f"at {dag.n_stages}×{dag.n_microbatches} it takes {secs(at_least)} or more with "
        f"{SOLVER_NAME[opts.solver]}"
    )
    cannot_finish = at_least > lp_left
    unlikely_to = at_least > LP_FLOOR_SHARE * lp_left  # most likely would not finish
    if opts.mode == "heuristic":
        build = LP_BUILD_PER_TIMER * timer_seconds
        if lp_left < build or unlikely_to:
            why = (
                f"its arrays alone take about {build:.1f} s here"
                if lp_left < build
                else f"{takes}, over {LP_FLOOR_SHARE:.0%} of the {secs(lp_left)} it would get"
            )
            return SolverError(
                f"no time for the LP relaxation in {LP_SHARE:.0%} of the time limit ({why})"
            )
    elif cannot_finish or (opts.fallback == "heuristic" and unlikely_to):
        leaves = (
            f"and the time limit leaves {secs(lp_left)}"
            if cannot_finish
            else f"over {LP_FLOOR_SHARE:.0%} of the {secs(lp_left)} the time limit leaves"
        )
        return LpUnsolved(
            f"no time for the LP relaxation: {takes}, {leaves}; "
            f"{more_time(opts.solver, dag, lp_left)}"
        )
    return None


def _answer_without_lp(
    problem: FreezeProblem, floor: float, deadline: float, failure: SolverError
) -> _WithoutLp:
    """The search's start and the bound without the LP: the rank-balanced plan and the rank-load
    bound (or `floor`, the all-frozen step time, if higher), or, with time for it and a gap worth
    closing, the first-order relaxation's rounded plan and bound where they are better."""
    need = rank_needs(problem)
    bound = max(rank_bound(problem, need), floor)
    start = balanced_plan(problem, need)
    how = "the search from a rank-balanced start"
    bound_note = f"the rank-load bound ({bound:.1f} ms; see freezeopt.solver.balance)"
    relax_needs = RELAX_ITERATIONS * RELAX_SECONDS_PER_ACTION * len(problem.dag.order)
    rounding = ROUND_SECONDS_PER_KEY * len(problem.keys)
    balanced, t_balanced = start, problem.makespan(start)
    proven = 1 - bound / t_balanced  # the rank-balanced start's proven gap
    relax_left = seconds_left(deadline) * RELAX_SHARE - rounding
    if proven > RELAX_ABOVE_GAP and relax_left >= relax_needs:
        relaxed = _relaxed(problem, time.perf_counter() + relax_left)
        if relaxed is not None:
            r, rounded = relaxed
            t_rounded = problem.makespan(rounded)
            if t_rounded < t_balanced * (1 + RELAXED_WITHIN) - 1e-9:
                start = rounded
                how = "the search from the first-order relaxation's plan rounded"
            how = (
                f"{r.iterations} iterations of the first-order relaxation (freezeopt.solver.relax), "
                f"then {how} (rounded {t_rounded:.1f} ms, rank-balanced {t_balanced:.1f} ms)"
            )
            if r.bound > bound:
                bound_note = (
                    f"the first-order relaxation's bound ({r.bound:.1f} ms; see "
                    f"freezeopt.solver.relax), above {bound_note}"
                )
                bound = r.bound
    if problem.dag.has_truncation and bound > floor:
        # the rank loads and the relaxation leave backward truncation out: their bounds are not
        # bounds then; the all-frozen floor, truncation counted, is
        bound, bound_note = (
            floor,
            f"the all-frozen floor ({floor:.1f} ms: with truncation the rank-load bound does not hold)",
        )
    notes = [
        f"{failure}; answered without the LP: {how}"
        + (" (--fallback heuristic)" if problem.opts.mode != "heuristic" else ""),
        f"lp_bound_ms is {bound_note}, at or below the LP bound, which is unknown",
    ]
    return _WithoutLp(start, bound, balanced, t_balanced, notes)


def _relaxed(problem: FreezeProblem, until: float) -> tuple[Relaxation, dict[Key, float]] | None:
    """The first-order relaxation until `until` and its plan in whole microbatches
    (`Relaxation.rounded`); None when it found nothing to freeze."""
    r = relax(problem, deadline=until)
    if not r.iterations:
        return None
    return r, r.rounded


def _dived(
    problem: FreezeProblem,
    pulp_model: PulpModel,
    lp: LpRelaxation,
    frozen: dict[Key, float],
    deadline: float,
    clock: Deadline,
    notes: list[str],
) -> dict[Key, float]:
    """The MILP's start: the LP dives' plan where it beats the heuristic's `frozen`. They get up
    to half the time left (all of it when there is no time for the MILP)."""
    share = 0.5 if pulp_model.no_time_for_milp(deadline) is None else 1.0
    dive_clock = Deadline(time.perf_counter() + share * seconds_left(deadline))
    dived = dives(problem, lp.take(), dive_clock, clock, pulp_model.spent)
    if dived:
        t_round, t_dive = problem.makespan(frozen), problem.makespan(dived)
        if t_dive < t_round - 1e-9:
            by = (
                f"{t_dive:.2f} against {t_round:.2f} ms"
                if t_round - t_dive >= 0.01
                else "by under 0.01 ms"
            )
            notes.append(f"LP diving found a faster start for the MILP than rounding ({by})")
            return dived
    return frozen


def _check_options(dag: PipelineDag, signal: Signal, o: SolveOptions) -> None:
    """What the options cannot check alone (they check their own ranges): that the signal model
    is the DAG's."""
    if [len(r) for r in signal] != [len(r) for r in dag.group_names]:
        raise InputError("sensitivities do not match the profile's groups")


def load_kernels() -> None:
    """Load (the first time on a machine: compile) every compiled pass a solve may run: the
    simulator's, the relaxation's and the search's. numba loads them from its cache in about
    0.5 s; a caller with a short time limit calls this before the clock starts."""
    from freezeopt.model.simulate import load_passes
    from freezeopt.solver.relax import load_relax_passes

    load_passes()
    load_relax_passes()
    load_search_kernels()


def _by_key(item: tuple[Key, float]) -> tuple[int, str, int, int]:
    """Sorts (key, value) pairs as `sorted` does, three times as fast as comparing `Action`s."""
    (a, g), _ = item
    return a.stage, a.kind, a.microbatch, g
