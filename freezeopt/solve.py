"""What to freeze, where: the optimisation over a pipeline DAG, posed in PuLP.

Variables: a start time `t_v` per action, a makespan `T`, and `x[v,g] ∈ {0,1}` ("group g is frozen
in action v") for every action holding weight-gradient work (`B`, `W`). An action lasts
`D_v − Σ_g c[s,g]·x[v,g]`, with `c` the measured weight-gradient cost of group g of stage s.
Precedence along every DAG edge: `t_u + d_u + lag(u,v) ≤ t_v`; `T ≥ t_v + d_v` for the last
actions. Per (stage, group), `k = Σ_m x[(s,m),g]` microbatches are frozen, at most
`floor(group_cap·M)` of them, and the group loses `loss_sg(k)` of the step's expected progress
(`freezeopt.sensitivity`); `loss_sg` is convex, so `ℓ_sg ≥` each of its linear pieces carries it
exactly. The budget: `Σ ℓ_sg ≤ ε`. An optional per-stage cap bounds the mean freeze ratio
(freezable time skipped / freezable time) over a stage's backwards, TimelyFreeze's only control.

The objective is lexicographic, in two solves rather than a big-M constant: phase 1 minimises `T`;
phase 2 minimises the signal dropped `Σ ℓ` subject to `T ≤ (1 + tolerance)·T1`.

Modes: `milp` (binary x, warm-started from the better of the heuristic's plan and the LP dives',
`freezeopt.dive`), `lp` (x ∈ [0,1], the continuous relaxation; with one group per stage, `flat`
sensitivity, no budget and a per-stage cap it is TimelyFreeze's LP), and `heuristic` (round the
LP's phase-2 solution down per group, `freezeopt.dive.round_down`, then search,
`freezeopt.search`: greedily freeze more on the critical path while the budget allows, then swap:
move a group's freezing from a microbatch with slack to one on the critical path — the same
counts, so the same signal and caps — and fill again; with time left once these moves stop
helping, kicks: release the frozen keys with the most slack and search again). The heuristic
gives the LP `LP_SHARE` of its time (none when the LP cannot fit: `LP_BUILD_PER_TIMER`,
`LP_SECONDS_PER_PAIR2`, `LP_FLOOR_SHARE`); when the LP does not
solve in it (70–155 s at 64×256 with HiGHS), the same search starts from a plan built without the LP and
the reported bound is the rank-load bound (`freezeopt.balance`), or, with time for it, the better
start and the higher bound of that and the first-order relaxation (`freezeopt.relax`,
`RELAX_SHARE` of the time left), so `heuristic` answers within its time limit at every size. Such
a start leaves much of the budget for the search: while its time is short for that, its fill
freezes keys in batches (`freezeopt.search.FILL_BATCH`). `milp` and `lp` need the LP: where its
floor (`LP_SECONDS_PER_PAIR2`, `CBC_LP_SECONDS_PER_PAIR2` through PuLP with CBC) exceeds the whole
time limit they raise `LpUnsolved` before starting it, and with `fallback="heuristic"` (the
heuristic's answer without the LP, with the whole time for its search) already where the floor
exceeds `LP_FLOOR_SHARE` of it, as `heuristic` does.
`time_limit` bounds the whole solve (less `WRAP_UP`, for reading the answer back). Solvers check
their limits rarely inside a MIP's root node: CBC solves the root LP first, so `milp` with CBC
starts no MILP with less time left than the relaxation took, and a CBC run past its limit is
stopped (`freezeopt.pulp_solvers.CbcWatchdog`); HiGHS's phase 2 (whose first root
step took about 9 s at 16×64 with 8 groups) runs in a child process killed at the deadline
(`freezeopt.highs_child`), and phase 1's overrun of its half of the time comes out of phase 2's.
Every mode reports the no-freeze step time, the all-frozen floor, the LP bound and the step time
the list-scheduling simulator gives for the answer.

Sparse throughout: one row per DAG edge, and the per-group count `k_sg` is its own variable, so the
piecewise-linear pieces hold two nonzeros each rather than every microbatch's `x`. With HiGHS,
phase 2 re-solves the phase-1 model in place (new objective, `T` bounded), starting from phase 1's
basis or incumbent; CBC solves phase 2 from a fresh model, MIP-started from phase 1's answer.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import pulp

from freezeopt.actions import Action
from freezeopt.balance import balanced_plan, rank_bound, rank_needs
from freezeopt.dag import PipelineDag
from freezeopt.dive import dives, round_down
from freezeopt.errors import InputError, LpUnsolved, SolverError
from freezeopt.fileio import stdout_to_stderr
from freezeopt.highs_child import solve_mip_until
from freezeopt.lp_fast import FastLP, LpCache, phase2_limit
from freezeopt.pulp_solvers import highs_status, run_pulp, write_pulp_model
from freezeopt.relax import Relaxation, relax
from freezeopt.search import (
    FILL_BATCH,
    Deadline,
    KeyIndex,
    load_search_kernels,
    search,
    stage_load_cap,
)
from freezeopt.sensitivity import Estimator, GroupSignal
from freezeopt.simulate import Timer, simulate

__all__ = [
    "MODES",
    "SOLVERS",
    "Mode",
    "SolveOptions",
    "SolveResult",
    "SolverName",
    "load_kernels",
    "solve",
]

Mode = Literal["milp", "lp", "heuristic"]
SolverName = Literal["cbc", "highs"]
MODES: tuple[Mode, ...] = ("milp", "lp", "heuristic")
SOLVERS: tuple[SolverName, ...] = ("cbc", "highs")
Key = tuple[Action, int]
_IPM_FROM = 3000  # actions; below this, simplex is as fast
WRAP_UP = 0.1
"""Seconds of the time limit (at most 5 %) kept back from the solvers and the search, for reading
their answer back and re-timing it (15–70 ms at 16×64 with 8 groups, about 0.1 s for the 15,000
frozen keys of a 64×256 plan)."""
WITHOUT_LP = "or answer without the LP: --mode heuristic, or --fallback heuristic"
"""What an LP failure's message ends with where the options do not already allow for it."""
LP_SHARE = 0.8
"""Share of the time limit the `heuristic` mode gives the LP relaxation. If the LP does not solve
in it, the search from the LP-free start (`freezeopt.balance`) has the rest."""
LP_BUILD_PER_TIMER = 4.0
"""The LP's arrays take about this many times as long to build as the simulator's (2.4–4.1×
measured from 16×64 to 64×256): with less time than that left for the LP, `heuristic` skips it."""
LP_SECONDS_PER_PAIR2 = 1.5e-7
"""A floor on the LP relaxation's solve time, in seconds per (stage × microbatch)² — pairs, not
actions, so schedules with two or three actions a pair sit on one scale: every measured solve took
1.5× this or longer (Interleaved1F1B 4.2 s at 32×128 and 64–67 s at 64×256; ZBV 5.5 s and
82–85 s; 1F1B 5.5 s and 106–108 s; 1F1B 16×64 with 8 groups, 0.84 s, 5.5×; benchmarks/solver.md
runs L and M). `heuristic` skips an LP this says cannot fit in its share of the time (at a 2 s
limit, every schedule from 32×128 up: the floor is 2.5 s there, 40 s at 64×256)."""
CBC_LP_SECONDS_PER_PAIR2 = 1e-6
"""The same floor for the LP relaxation through PuLP with CBC (`--solver cbc`, both phases): every
measured solve took 2.8× this or longer (8×64: 0.73–1.62 s; 16×64: 1F1B 8.4 s, ZBV 12.3 s;
32×128: 1F1B 61.5 s, Interleaved1F1B and ZBV over 120 s; session 21 and benchmarks/solver.md run
A). 268 s at 64×256: `milp` and `lp` with CBC there and the default 60 s fail at once, and
`--fallback heuristic` gets the whole time limit, instead of the LP's failure after it."""
LP_FLOOR_SHARE = 0.5
"""`heuristic` tries the LP only when its floor (`LP_SECONDS_PER_PAIR2`, or
`CBC_LP_SECONDS_PER_PAIR2` with CBC) is at most this share of the time it would get: the floor is
1.5–2.8× under the solves measured, so past half the share the LP would most likely not finish
(64×256 at the default 60 s: floor 40 s, LP 66–113 s here), and the time is better spent without
it. 32×128 at 10 s (floor 2.5 s, LP 4.2–6.3 s) still tries it. `milp` and `lp` give up on the LP
by this rule only with `fallback="heuristic"`; without, only where the floor exceeds the whole
time left: the user asked for the LP."""
RELAX_ABOVE_GAP = 0.001
"""The relaxation runs only when the rank-balanced start is proven further than this from the
rank-load bound: where it is proven optimal, or all but, the search's time is worth more. Until
session 17 this was 3 %, which kept the relaxation off ZBV (its start proven 2.2–2.3 % from the
rank-load bound at 32×128 and 64×256): there it then lost to the search alone (ZBV 32×128 with
2 s: 0.41 % from the LP bound with it, 0.12 % without). With the gradients' moving average
(`freezeopt.relax.MOMENTUM`) it wins, measured side by side (two runs each, gap to the LP
optimum): ZBV 64×256 with 2 s 0.90–0.93 → 0.35–0.43 %, with 10 s 0.33 → 0.08 %; 32×128 with 2 s
0.13 → 0.07 %."""
RELAX_SHARE = 0.45
"""Share of the time left that the first-order relaxation (`freezeopt.relax`) gets when the
answer comes without the LP, rounding its plan included; the search has the rest. 0.6 from
session 11 (then against 0.5, with a slower search and no kicks) to session 20. Since the search's
tries got cheaper, 1F1B gains more from search time than from relaxation time: side by side in
fresh processes at 64×256 with 2 s (five runs each, gap to the LP optimum, medians), 0.6 → 0.45:
1F1B 3.48 → 3.31 % (every run better), Interleaved1F1B 0.46 → 0.48 %, ZBV 0.19 → 0.21 %, 1F1B
32×128 1.93 → 1.92 %; with 10 s (two runs each) 1F1B 2.25–2.37 → 2.25–2.26 %, Interleaved1F1B
0.30–0.31 → 0.28–0.29 %. 0.4 did as well for 1F1B and worse for ZBV (0.28 %); 0.3 was better for
1F1B (3.23–3.43 %) and worse for ZBV and Interleaved1F1B (0.37–0.41 %, 0.56–0.59 %)."""
ROUND_SECONDS_PER_KEY = 5e-7
"""Rounding the relaxation's plan (`freezeopt.relax`) comes out of its share: 0.35–0.4 µs per key
measured at 64×256 (23–24 ms for 65 k keys; over dicts of `Action` keys it took 0.2–0.3 s)."""
RELAXED_WITHIN = 0.02
"""The search starts from the relaxation's rounded plan unless the rank-balanced plan is faster by
more than this share: rounding down leaves part of the budget (5–10 % at 64×256) for the search
to spend, which a plan that spends it all cannot. Measured at 1F1B 64×256 with 2 s, the
relaxation cut short to get rounded plans around the rank-balanced one (9325.3 ms): from rounded
plans 0.3–1.4 % slower, the search ended 6.9–7.3 % from the LP bound where the rank-balanced start
ends 9.0–9.3 %; from 2.6–4.2 % slower, 7.9–9.5 %."""
RELAX_ITERATIONS = 40
RELAX_SECONDS_PER_ACTION = 1.5e-7
"""The relaxation runs only when its share of the time fits `RELAX_ITERATIONS` iterations at
`RELAX_SECONDS_PER_ACTION` per action each (measured in session 15: 0.073–0.083 µs per action
with 4 groups from 32×128 to 64×256, 0.105 µs at 32×128 with 8 groups; before its passes and
knapsack got cheaper, 0.21–0.29 and 0.47 µs with 4e-7 here); fewer would spend the search's time
on a worse start and a looser bound. At 64×256 with `--time-limit 1.3` the relaxation now runs
(4e-7 skipped it): three fresh runs each, Interleaved1F1B 6.38–6.66 → 2.58–3.46 % from the LP
bound, 1F1B 5.83–9.30 → 5.73–6.61 %. A count of actions, not a clock, so the choice does not move
with the machine's load (the simulator's build time, tried first, varied 0.19–0.62 s at
64×256)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveOptions:
    """How to solve."""

    mode: Mode = "milp"
    solver: SolverName = "cbc"
    budget: float = 0.1
    """Largest share of one step's expected progress that freezing may drop, in [0, 1]."""
    group_cap: float = 0.75
    """Largest share of a step's microbatches in which one group may be frozen, in [0, 1]."""
    stage_cap: float | None = None
    """Optional cap on a stage's mean freeze ratio (TimelyFreeze uses 0.9)."""
    sensitivity: Estimator = "gns"
    tolerance: float = 0.0
    """Phase 2 may lengthen the step by this share of the phase-1 optimum to drop less signal."""
    time_limit: float = 60.0
    """Seconds for the whole solve: the LP, the heuristic's search, the LP dives and both MILP
    phases (the heuristic always answers: past the limit its search stops with the plan so far)."""
    gap: float = 0.005
    """Relative MILP gap at which the solver may stop."""
    threads: int = 1
    write_model: Path | None = None
    """Write the phase-1 model here (`.lp` or `.mps`) and phase 2 beside it (`NAME.phase2.lp`)."""
    fallback: Literal["none", "heuristic"] = "none"
    """On a solver failure in `milp` or `lp` (missing, crashed, out of time before the LP solved),
    or where the LP would most likely not finish in the time (`LP_FLOOR_SHARE`): `heuristic`
    answers with the search from a plan built without the LP (status `heuristic_fallback`, LP
    bound replaced by the rank-load bound of `freezeopt.balance` or the first-order relaxation's;
    the search stops at the time limit) instead of failing. The `heuristic` mode always does this."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveResult:
    """The answer and the figures that put it in context (times in ms)."""

    status: str
    """`optimal`, `time_limit` (best found, not proven), `heuristic` or `heuristic_fallback`."""
    mode: Mode
    solver: SolverName
    baseline_ms: float
    """Simulated step time with nothing frozen."""
    all_frozen_ms: float
    """Simulated step time with every freezable group frozen everywhere: the floor."""
    lp_bound_ms: float
    """Phase-1 optimum of the LP relaxation under the same budget and caps: no plan beats it.
    Where the answer came without the LP (`bound_from_lp` false), a bound of its own, at or below
    the LP's: the rank-load bound or the first-order relaxation's (the notes say which)."""
    predicted_ms: float
    """Simulated step time of the answer."""
    gap: float
    """(predicted − LP bound) / predicted: an upper bound on how far the answer can be from optimal."""
    signal_dropped: float
    """Share of one step's expected progress the answer drops."""
    solve_seconds: float
    frozen: Mapping[Key, float]
    """(action, group index) → frozen extent (1.0 in milp/heuristic; fractions in lp). Zeros omitted."""
    budget: float
    notes: tuple[str, ...] = ()
    bound_from_lp: bool = True
    """Whether `lp_bound_ms` is the LP relaxation's optimum (see `lp_bound_ms`)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent building models (`build`: PuLP's, or the LP's arrays), in the solver
    (`solver`) and in the rest (`other`)."""


def solve(
    dag: PipelineDag,
    signal: tuple[tuple[GroupSignal, ...], ...],
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
    full collection walks them all; it frees no cycles a solve makes (none are made). Measured at
    Interleaved1F1B 64×256 with `--time-limit 2` in a fresh process: the model, simulator and index
    took 0.50–0.58 s with the collector on and 0.33–0.35 s paused, which decided whether the
    relaxation had time to run at all (6.3 % from the LP bound without it, 4–5 % with it). The
    pause is process-wide, so a solve never runs in a training process (re-plans have their own,
    `freezeopt.solver_process`)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _solve(
    dag: PipelineDag,
    signal: tuple[tuple[GroupSignal, ...], ...],
    opts: SolveOptions,
    *,
    lp_cache: LpCache | None,
) -> SolveResult:
    _check_options(dag, signal, opts)
    mode = opts.mode
    t0 = time.perf_counter()
    # the solvers and the search stop a little early: reading their answer back and re-timing it
    # takes 15–70 ms at 16×64 with 8 groups, and the whole solve should end by the time limit
    deadline = t0 + opts.time_limit - min(WRAP_UP, 0.05 * opts.time_limit)
    model = _Model(dag, signal, opts, lp_cache=lp_cache)
    baseline = model.makespan({})
    timer_seconds = time.perf_counter() - t0
    floor = model.timer.times(np.maximum(model.timer.floor, 0.0))[0]  # all frozen
    notes: list[str] = []

    # the heuristic gives the LP LP_SHARE of its time; the search from the LP-free start, the rest
    lp_deadline = deadline if mode != "heuristic" else t0 + LP_SHARE * (deadline - t0)
    start: dict[Key, float] | None = None
    balanced: dict[Key, float] = {}  # without the LP: the rank-balanced plan, whatever the start
    t_balanced = math.inf  # and its step time
    bound_from_lp = True
    try:
        lp_left = _left(lp_deadline)
        at_least = _lp_floor(dag, opts.solver)
        takes = (
            f"at {dag.n_stages}×{dag.n_microbatches} it takes {_secs(at_least)} or more with "
            f"{_SOLVER_NAME[opts.solver]}"
        )
        cannot_finish = at_least > lp_left
        unlikely_to = at_least > LP_FLOOR_SHARE * lp_left  # most likely would not finish
        if mode == "heuristic":
            build = LP_BUILD_PER_TIMER * timer_seconds
            if lp_left < build or unlikely_to:
                why = (
                    f"its arrays alone take about {build:.1f} s here"
                    if lp_left < build
                    else f"{takes}, over {LP_FLOOR_SHARE:.0%} of the {_secs(lp_left)} it would get"
                )
                raise SolverError(
                    f"no time for the LP relaxation in {LP_SHARE:.0%} of the time limit ({why})"
                )
        elif cannot_finish or (opts.fallback == "heuristic" and unlikely_to):
            leaves = (
                f"and the time limit leaves {_secs(lp_left)}"
                if cannot_finish
                else f"over {LP_FLOOR_SHARE:.0%} of the {_secs(lp_left)} the time limit leaves"
            )
            raise LpUnsolved(
                f"no time for the LP relaxation: {takes}, {leaves}; "
                f"{_more_time(opts.solver, dag, lp_left)}"
            )
        lp1, lp_x = model.solve_lp(
            lp_deadline, write=opts.write_model if opts.mode != "milp" else None
        )
    except SolverError as e:
        if opts.fallback != "heuristic" and mode != "heuristic":
            if isinstance(e, LpUnsolved):
                raise LpUnsolved(f"{e}; {WITHOUT_LP}") from None
            raise
        lp1, start = model.lp_free(floor)
        lp_x = {}
        bound_from_lp = False
        how = "the search from a rank-balanced start"
        bound_note = f"the rank-load bound ({lp1:.1f} ms; see freezeopt.balance)"
        relax_needs = RELAX_ITERATIONS * RELAX_SECONDS_PER_ACTION * len(dag.order)
        rounding = ROUND_SECONDS_PER_KEY * len(model.keys)
        balanced, t_balanced = start, model.makespan(start)
        proven = 1 - lp1 / t_balanced  # the rank-balanced start's proven gap
        relax_left = _left(deadline) * RELAX_SHARE - rounding
        if proven > RELAX_ABOVE_GAP and relax_left >= relax_needs:
            relaxed = model.relaxed(time.perf_counter() + relax_left)
            if relaxed is not None:
                r, rounded = relaxed
                t_rounded = model.makespan(rounded)
                if t_rounded < t_balanced * (1 + RELAXED_WITHIN) - 1e-9:
                    start = rounded
                    how = "the search from the first-order relaxation's plan rounded"
                how = (
                    f"{r.iterations} iterations of the first-order relaxation (freezeopt.relax), "
                    f"then {how} (rounded {t_rounded:.1f} ms, rank-balanced {t_balanced:.1f} ms)"
                )
                if r.bound > lp1:
                    bound_note = (
                        f"the first-order relaxation's bound ({r.bound:.1f} ms; see "
                        f"freezeopt.relax), above {bound_note}"
                    )
                    lp1 = r.bound
        notes.append(
            f"{e}; answered without the LP: {how}"
            + (" (--fallback heuristic)" if mode != "heuristic" else "")
        )
        notes.append(f"lp_bound_ms is {bound_note}, at or below the LP bound, which is unknown")
        opts = replace(opts, mode="heuristic")
    predicted: float | None = None  # the answer's step time, where it is known already
    if opts.mode == "lp":
        frozen, status = lp_x, "optimal"
    else:
        clock = Deadline(deadline)
        if start is None:
            frozen = _round_and_fill(dag, model, lp_x, clock, kicks=opts.mode == "heuristic")
        else:
            frozen = search(dag, model, start, clock, batch=FILL_BATCH, kicks=True)
            predicted = model.makespan(frozen)
            if predicted > t_balanced:  # never slower than the rank-balanced start
                frozen, predicted = balanced, t_balanced
        status = "heuristic_fallback" if start is not None else "heuristic"
        if clock.hit:
            notes.append(
                "the heuristic's search stopped at the time limit with the best plan so far "
                "(raise --time-limit for a better one)"
            )
        if opts.mode == "milp":
            if not clock.hit:  # dive from the LP in up to half the time left (all if no MILP)
                share = 0.5 if model.no_time_for_milp(deadline) is None else 1.0
                dive_clock = Deadline(time.perf_counter() + share * _left(deadline))
                dived = dives(dag, model, dive_clock, clock)
                if dived:
                    t_round, t_dive = model.makespan(frozen), model.makespan(dived)
                    if t_dive < t_round - 1e-9:
                        by = (
                            f"{t_dive:.2f} against {t_round:.2f} ms"
                            if t_round - t_dive >= 0.01
                            else "by under 0.01 ms"
                        )
                        notes.append(
                            f"LP diving found a faster start for the MILP than rounding ({by})"
                        )
                        frozen = dived
            frozen, status, milp_notes = model.solve_milp(frozen, deadline, write=opts.write_model)
            notes.extend(milp_notes)
            predicted = None
    if predicted is None:
        predicted = model.makespan(frozen)
    lp_bound = min(lp1, predicted)
    if opts.write_model is not None and not model.wrote_model:
        why = "the answer came without the LP" if not bound_from_lp else "no time for the MILP"
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
        signal_dropped=model.signal_of(frozen),
        solve_seconds=time.perf_counter() - t0,
        frozen={k: v for k, v in sorted(frozen.items(), key=_by_key) if v > 1e-9},
        budget=opts.budget,
        notes=tuple(notes),
        bound_from_lp=bound_from_lp,
        timings={
            "build": model.build_seconds,
            "solver": model.solver_seconds,
            "other": time.perf_counter() - t0 - model.build_seconds - model.solver_seconds,
        },
    )


def _check_options(
    dag: PipelineDag, signal: tuple[tuple[GroupSignal, ...], ...], o: SolveOptions
) -> None:
    for name, v in (
        ("--budget", o.budget),
        ("--group-cap", o.group_cap),
        ("--tolerance", o.tolerance),
    ):
        if not (isinstance(v, float | int) and math.isfinite(v) and 0 <= v <= 1):
            raise InputError(f"{name} must be a number in [0, 1] (got {v})")
    if o.stage_cap is not None and not (math.isfinite(o.stage_cap) and 0 <= o.stage_cap <= 1):
        raise InputError(f"--stage-cap must be in [0, 1] (got {o.stage_cap})")
    if not (o.time_limit > 0 and math.isfinite(o.time_limit)):
        raise InputError(
            f"--time-limit must be a positive, finite number of seconds (got {o.time_limit})"
        )
    if not (0 <= o.gap < 1):
        raise InputError(f"--gap must be in [0, 1) (got {o.gap})")
    if o.threads < 1:
        raise InputError(f"--threads must be at least 1 (got {o.threads})")
    if o.fallback not in ("none", "heuristic"):
        raise InputError(f"unknown fallback {o.fallback!r}; use none or heuristic")
    if o.mode not in MODES:
        raise InputError(f"unknown mode {o.mode!r}; use one of {', '.join(MODES)}")
    if o.solver not in SOLVERS:
        raise InputError(f"unknown solver {o.solver!r}; use one of {', '.join(SOLVERS)}")
    if [len(r) for r in signal] != [len(r) for r in dag.group_names]:
        raise InputError("sensitivities do not match the profile's groups")


@dataclass(slots=True)
class _Vars:
    """The PuLP variables of one built model."""

    x: dict[Key, pulp.LpVariable]
    T: pulp.LpVariable
    ell: list[pulp.LpVariable]


class _Model:
    """Builds and solves the PuLP models for one DAG and option set (sparse: one row per edge)."""

    def __init__(
        self,
        dag: PipelineDag,
        signal: tuple[tuple[GroupSignal, ...], ...],
        opts: SolveOptions,
        *,
        lp_cache: LpCache | None = None,
    ):
        self.dag, self.opts = dag, opts
        self.lp_cache = lp_cache
        m = dag.n_microbatches
        self.kmax = math.floor(opts.group_cap * m + 1e-9)
        self.loss = {(s, g): sig.loss for s, row in enumerate(signal) for g, sig in enumerate(row)}
        self.keys: list[Key] = [
            (a, g)
            for a in dag.freezable()
            for g, c in enumerate(dag.group_cost[a.stage])
            if c > 0 and self.kmax > 0
        ]
        self.build_seconds = 0.0
        self.solver_seconds = 0.0
        self.wrote_model = False
        """Whether `--write-model` wrote a model: not where no PuLP model was built for the answer
        (no LP, or no time for the MILP)."""
        self._spare_lp: FastLP | None = None
        self.relax_seconds = 0.0
        """Seconds phase 1 of the LP relaxation took through PuLP (model and solver; 0 with
        HiGHS's array path), about what CBC spends on a MILP's root LP before it checks its
        time limit."""
        self.by_group: dict[tuple[int, int], list[Key]] = {}
        for k in self.keys:
            self.by_group.setdefault((k[0].stage, k[1]), []).append(k)
        self.stage_share = {
            (s, g): c / sum(cs)
            for s, cs in enumerate(dag.group_cost)
            for g, c in enumerate(cs)
            if c > 0
        }

    @functools.cached_property
    def timer(self) -> Timer:
        """The DAG as arrays for re-timing (built once per model: about 0.1 s per 8 k actions)."""
        return Timer(self.dag)

    def makespan(self, plan: Mapping[Key, float]) -> float:
        """The step time `simulate` gives for a plan (durations clipped at zero as
        `PipelineDag.durations` clips them)."""
        t = self.timer
        return t.times(np.maximum(t.durations(plan), 0.0))[0]

    @functools.cached_property
    def index(self) -> KeyIndex:
        """The keys as arrays over `timer`'s positions, for the heuristic's search."""
        return KeyIndex.of(self)

    # -- evaluation -------------------------------------------------------------------------
    def counts(self, frozen: Mapping[Key, float]) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        for (a, g), x in frozen.items():
            out[(a.stage, g)] = out.get((a.stage, g), 0.0) + x
        return out

    def signal_of(self, frozen: Mapping[Key, float]) -> float:
        """Signal dropped by a plan (piecewise-linear in the count for fractional plans)."""
        return sum(_pwl(self.loss[sg], k) for sg, k in self.counts(frozen).items())

    def fits(self, frozen: Mapping[Key, float]) -> bool:
        """Budget, group caps and stage caps all hold (with a small tolerance)."""
        counts = self.counts(frozen)
        if any(k > self.kmax + 1e-6 for k in counts.values()):
            return False
        if self.opts.stage_cap is not None:
            per_stage: dict[int, float] = {}
            for (s, g), k in counts.items():
                per_stage[s] = per_stage.get(s, 0.0) + k * self.stage_share[(s, g)]
            cap = self.opts.stage_cap * self.dag.n_microbatches + 1e-6
            if any(v > cap for v in per_stage.values()):
                return False
        return sum(_pwl(self.loss[sg], k) for sg, k in counts.items()) <= self.opts.budget + 1e-9

    # -- model building ---------------------------------------------------------------------
    def build(self, *, integer: bool, t_max: float | None) -> tuple[pulp.LpProblem, _Vars]:
        t0 = time.perf_counter()
        try:
            return self._build(integer=integer, t_max=t_max)
        finally:
            self.build_seconds += time.perf_counter() - t0

    def _build(self, *, integer: bool, t_max: float | None) -> tuple[pulp.LpProblem, _Vars]:
        dag, opts = self.dag, self.opts
        prob = pulp.LpProblem(
            "freezeopt_phase2" if t_max is not None else "freezeopt_phase1", pulp.LpMinimize
        )
        t = {a: prob.add_variable(f"t_{a}", 0) for a in dag.order}
        cat = pulp.LpBinary if integer else pulp.LpContinuous
        x = {(a, g): prob.add_variable(f"x_{a}_g{g}", 0, 1, cat) for a, g in self.keys}
        T = prob.add_variable("makespan", 0)
        xs_of: dict[Action, list[tuple[pulp.LpVariable, float]]] = {}
        for (a, g), var in x.items():
            xs_of.setdefault(a, []).append((var, -dag.group_cost[a.stage][g]))

        def le(
            terms: list[tuple[pulp.LpVariable, float]], rhs: float, name: str, const: float = 0.0
        ) -> None:
            e = pulp.LpAffineExpression(terms, constant=const)
            prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintLE, name, rhs))

        for u in dag.order:
            dur, terms, succ = dag.cost[u], xs_of.get(u, []), dag.graph.succ[u]
            for v, attrs in succ.items():
                le([(t[u], 1.0), (t[v], -1.0), *terms], 0.0, f"prec_{u}_{v}", dur + attrs["lag"])
            if not succ:
                le([(t[u], 1.0), (T, -1.0), *terms], 0.0, f"end_{u}", dur)
        ell: list[pulp.LpVariable] = []
        for (s, g), keys in sorted(self.by_group.items()):
            k = prob.add_variable(f"count_s{s}_g{g}", 0)
            e = pulp.LpAffineExpression([*((x[kk], 1.0) for kk in keys), (k, -1.0)])
            prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintEQ, f"count_s{s}_g{g}", 0.0))
            le([(k, 1.0)], float(self.kmax), f"groupcap_s{s}_g{g}")
            sig = prob.add_variable(f"signal_s{s}_g{g}", 0)
            ell.append(sig)
            loss, last_slope = self.loss[(s, g)], None
            for j in range(self.kmax):
                slope = loss[j + 1] - loss[j]
                if last_slope is not None and abs(slope - last_slope) <= 1e-12 * max(
                    1.0, abs(slope)
                ):
                    continue  # same line as the previous piece
                last_slope = slope
                # signal ≥ loss[j] + slope·(k − j)
                le([(sig, -1.0), (k, slope)], 0.0, f"piece_s{s}_g{g}_k{j}", loss[j] - slope * j)
        if opts.stage_cap is not None:
            for s in range(dag.n_stages):
                terms2 = [
                    (x[kk], self.stage_share[(s, kk[1])]) for kk in self.keys if kk[0].stage == s
                ]
                if terms2:
                    le(terms2, opts.stage_cap * dag.n_microbatches, f"stagecap_s{s}")
        if ell:
            le([(v, 1.0) for v in ell], opts.budget, "budget")
        if t_max is None:
            prob.setObjective(pulp.LpAffineExpression([(T, 1.0)]))
        else:
            le([(T, 1.0)], t_max, "makespan_limit")
            prob.setObjective(pulp.LpAffineExpression([(v, 1.0) for v in ell] or [(T, 0.0)]))
        return prob, _Vars(x=x, T=T, ell=ell)

    def _write(self, prob: pulp.LpProblem, path: Path | None, *, phase: int) -> None:
        """`--write-model`: write a phase's PuLP model (phase 2 beside phase 1's file)."""
        if path is not None:
            write_pulp_model(prob, path, phase=phase)
            self.wrote_model = True

    def t_limit(self, t1: float) -> float:
        """Phase-2 bound on the makespan: the phase-1 value, the tolerance, and numerical slack."""
        return phase2_limit(t1, self.opts.tolerance)

    # -- solving ----------------------------------------------------------------------------
    def _timed(self, fn: Callable[[], str]) -> str:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.solver_seconds += time.perf_counter() - t0

    def _phases(
        self,
        *,
        integer: bool,
        start: Mapping[Key, float] | None,
        deadline: float,
        write: Path | None,
    ) -> tuple[str, str, dict[Key, float], float]:
        """Run phase 1 then phase 2; return (status1, status2, plan, T1). Where phase 1 finds
        nothing, phase 2 is `skipped`, the plan is `start` (or empty) and T1 is inf."""
        o = self.opts
        began = time.perf_counter()
        p1, v1 = self.build(integer=integer, t_max=None)
        self._write(p1, write, phase=1)
        if start is not None:
            self._warm(p1, v1, start)
        limit1 = _left(deadline) / 2 if integer else _left(deadline)
        # Large LPs here are very degenerate: interior point (with crossover, so phase 2 can start
        # from a basis) beats simplex by 3x and more from a few thousand actions up.
        ipm = not integer and len(self.dag.order) >= _IPM_FROM
        st1 = self._timed(
            lambda: run_pulp(p1, o, time_limit=limit1, warm=start is not None, barrier=ipm)
        )
        if not integer:
            self.relax_seconds = time.perf_counter() - began
        if st1 not in ("optimal", "time_limit"):
            return st1, "skipped", dict(start or {}), math.inf
        plan1 = {k: _clip(v.value()) for k, v in v1.x.items()}
        if integer:
            plan1 = {k: float(round(x)) for k, x in plan1.items()}
            t1 = self.makespan(plan1)  # the incumbent's true makespan
        else:
            t1 = float(v1.T.value())
        t_max = self.t_limit(t1)
        if write is not None:
            self._write(self.build(integer=integer, t_max=t_max)[0], write, phase=2)
        if o.solver == "highs":
            st2, plan2 = self._timed_highs_phase2(p1, v1, t_max, deadline)
        else:
            p2, v2 = self.build(integer=integer, t_max=t_max)
            if integer:
                self._warm(p2, v2, plan1)
            st2 = self._timed(
                lambda: run_pulp(p2, o, time_limit=_left(deadline), warm=integer, barrier=ipm)
            )
            plan2 = {k: _clip(v.value()) for k, v in v2.x.items()}
        if st2 not in ("optimal", "time_limit"):
            return st1, st2, plan1, t1
        if integer:
            plan2 = {k: float(round(x)) for k, x in plan2.items()}
        return st1, st2, plan2, t1

    def _timed_highs_phase2(
        self, p1: pulp.LpProblem, v1: _Vars, t_max: float, deadline: float
    ) -> tuple[str, dict[Key, float]]:
        """Phase 2 on phase 1's HiGHS model: objective Σ signal, T ≤ t_max, warm (an LP in place;
        a MIP in a child process, `freezeopt.highs_child`)."""
        h = p1.solverModel
        t0 = time.perf_counter()
        try:
            n = h.getNumCol()
            values = list(h.getSolution().col_value)
            cost = [0.0] * n
            for v in v1.ell:
                cost[v.index] = 1.0
            h.changeColsCost(n, list(range(n)), cost)
            h.changeColBounds(v1.T.index, 0.0, t_max)
            if h.getLp().integrality_:
                # MIP: in a child process stopped at the deadline (`freezeopt.highs_child`),
                # from phase 1's incumbent
                o = self.opts
                said, x = solve_mip_until(h, values, deadline, gap=o.gap, threads=o.threads)
                if x is None:
                    return ("infeasible" if said == "Infeasible" else said), {}
                status = "optimal" if said == "Optimal" else "time_limit"
                return status, {k: _clip(x[v.index]) for k, v in v1.x.items()}
            # for an LP, HiGHS compares time_limit with its run time summed over every run of
            # this model, phase 1's included
            limit = max(0.5, _left(deadline)) + h.getRunTime()
            h.setOptionValue("solver", "simplex")  # re-use phase 1's basis
            h.setOptionValue("time_limit", limit)
            with stdout_to_stderr():
                h.run()
            status = highs_status(h)
            col = list(h.getSolution().col_value)
            return status, {k: _clip(col[v.index]) for k, v in v1.x.items()}
        finally:
            self.solver_seconds += time.perf_counter() - t0

    def solve_lp(self, deadline: float, *, write: Path | None) -> tuple[float, dict[Key, float]]:
        """Both phases of the LP relaxation; returns (phase-1 T, phase-2 x).

        With HiGHS the LP goes straight to the solver as arrays (`freezeopt.lp_fast`: the same
        optimum, no PuLP objects); `write` then writes the PuLP models of both phases beside it."""
        if self.opts.solver == "highs":
            return self._solve_lp_fast(deadline, write=write)
        return self.solve_lp_pulp(deadline, write=write)

    def solve_lp_pulp(
        self, deadline: float, *, write: Path | None
    ) -> tuple[float, dict[Key, float]]:
        """Both LP phases through the PuLP models, with either solver (the reference path)."""
        st1, st2, plan, t1 = self._phases(integer=False, start=None, deadline=deadline, write=write)
        if st1 != "optimal" or st2 != "optimal":
            st = st1 if st1 != "optimal" else st2
            if "time" in st or st == "no_solution":
                hint = _more_time(self.opts.solver)
            else:
                hint = f"try --solver {_other(self.opts.solver)}"
            raise LpUnsolved(f"the LP relaxation did not solve ({st}); {hint}")
        return t1, plan

    def _solve_lp_fast(
        self, deadline: float, *, write: Path | None
    ) -> tuple[float, dict[Key, float]]:
        if not pulp.HiGHS().available():
            raise SolverError("HiGHS is not available: pip install highspy, or use --solver cbc")
        cache = self.lp_cache if self.lp_cache is not None else LpCache()
        t0 = time.perf_counter()
        try:
            ans, build_s = cache.solve(self, time_limit=_left(deadline))
        except SolverError:
            self.solver_seconds += time.perf_counter() - t0
            raise
        self.build_seconds += build_s
        self.solver_seconds += time.perf_counter() - t0 - build_s
        if self.lp_cache is None:  # a model of this solve alone: the dive may take it over
            self._spare_lp = cache.take()
        if write is not None:
            self._write(self.build(integer=False, t_max=None)[0], write, phase=1)
            self._write(self.build(integer=False, t_max=self.t_limit(ans.t1))[0], write, phase=2)
        return ans.t1, ans.x

    def solve_milp(
        self, start: dict[Key, float], deadline: float, *, write: Path | None
    ) -> tuple[dict[Key, float], str, list[str]]:
        """Both MILP phases, warm-started from `start`; falls back to `start` if the solver finds nothing."""
        notes: list[str] = []
        short = self.no_time_for_milp(deadline)
        if short:
            notes.append(
                f"{short}; kept the better of the heuristic's and the LP dive's plans "
                f"(raise --time-limit)"
            )
            return start, "heuristic_fallback", notes
        st1, st2, plan, _ = self._phases(integer=True, start=start, deadline=deadline, write=write)
        if st1 not in ("optimal", "time_limit"):
            notes.append(f"MILP phase 1 found no solution ({st1}); kept the heuristic answer")
            return start, "heuristic_fallback", notes
        if st2 not in ("optimal", "time_limit"):
            notes.append(f"MILP phase 2 found no solution ({st2}); kept phase 1's answer")
        status = "optimal" if st1 == st2 == "optimal" else "time_limit"
        if status == "time_limit":
            notes.append(
                "the MILP stopped on its time limit; the answer is the best found, not proven optimal"
            )
        best = {k: v for k, v in plan.items() if v}
        # never return worse than the warm start (a solver may ignore it)
        if self.makespan(best) > self.makespan(start) + 1e-9:
            notes.append(
                "the solver returned a plan slower than its warm start; kept the warm start"
            )
            return start, status, notes
        return best, status, notes

    def lp_free(self, floor: float) -> tuple[float, dict[Key, float]]:
        """Without the LP: a lower bound on the step time (the rank-load bound, or `floor`, the
        all-frozen step time, if higher) and a start for the search (`freezeopt.balance`)."""
        o = self.opts
        need = rank_needs(self.dag, self.timer)
        bound = rank_bound(self.dag, need, list(self.by_group), self.loss, self.kmax, o.budget)
        start = balanced_plan(
            self.dag,
            self.timer,
            need,
            self.by_group,
            self.loss,
            kmax=self.kmax,
            budget=o.budget,
            stage_share=self.stage_share,
            stage_cap=stage_load_cap(self.dag, self),
        )
        return max(bound, floor), start

    def relaxed(self, until: float) -> tuple[Relaxation, dict[Key, float]] | None:
        """Without the LP: the first-order relaxation until `until` (`freezeopt.relax`) and its
        plan in whole microbatches (`Relaxation.rounded`); None when it found nothing to freeze."""
        o = self.opts
        r = relax(
            self.dag,
            self.timer,
            self.by_group,
            self.loss,
            kmax=self.kmax,
            budget=o.budget,
            stage_share=self.stage_share,
            stage_cap=stage_load_cap(self.dag, self),
            deadline=until,
        )
        if not r.iterations:
            return None
        return r, r.rounded

    def take_lp(self) -> FastLP | None:
        """The LP relaxation's HiGHS model, solved, for the caller to change; None when the LP
        was not solved that way or lives in a shared `LpCache` (re-plans re-solve it warm)."""
        lp, self._spare_lp = self._spare_lp, None
        return lp

    def no_time_for_milp(self, deadline: float) -> str | None:
        """Why the MILP cannot start before `deadline`, or None when it can."""
        left = _left(deadline)
        if self.opts.solver == "cbc" and self.relax_seconds >= 1.0 and left < self.relax_seconds:
            # measured: 1F1B 16×64 with 8 groups, 1.3 s left, the MILP took 19.7 s
            return (
                f"no time left for the MILP: CBC re-solves the LP relaxation "
                f"({self.relax_seconds:.1f} s) before it checks its time limit, and {left:.1f} s "
                f"were left (--solver highs solves the relaxation much faster)"
            )
        return "no time left for the MILP" if left < 1.0 else None

    def _warm(self, prob: pulp.LpProblem, v: _Vars, plan: Mapping[Key, float]) -> None:
        """Set every variable's initial value from a feasible plan (its simulated timeline)."""
        tl = simulate(self.dag, self.dag.durations(plan))
        byname = prob.variablesDict()
        for a, s in tl.start.items():
            byname[f"t_{a}"].setInitialValue(s)
        for k, var in v.x.items():
            var.setInitialValue(round(plan.get(k, 0.0)))
        v.T.setInitialValue(tl.makespan)
        counts = self.counts(plan)
        for s, g in self.by_group:
            n = counts.get((s, g), 0.0)
            byname[f"count_s{s}_g{g}"].setInitialValue(n)
            byname[f"signal_s{s}_g{g}"].setInitialValue(_pwl(self.loss[(s, g)], n))


def _round_and_fill(
    dag: PipelineDag,
    model: _Model,
    lp_x: Mapping[Key, float],
    clock: Deadline | None = None,
    *,
    kicks: bool = False,
) -> dict[Key, float]:
    """Heuristic: round the LP down per group, then `search`. Past `clock`'s deadline the search
    stops and the plan so far (always feasible) is the answer."""
    return search(dag, model, round_down(model, lp_x), clock, kicks=kicks)


def load_kernels() -> None:
    """Load (the first time on a machine: compile) every compiled pass a solve may run: the
    simulator's, the relaxation's and the search's. numba loads them from its cache in about
    0.5 s; a caller with a short time limit calls this before the clock starts."""
    from freezeopt.relax import load_relax_passes
    from freezeopt.simulate import load_passes

    load_passes()
    load_relax_passes()
    load_search_kernels()


def _by_key(item: tuple[Key, float]) -> tuple[int, str, int, int]:
    """Sorts (key, value) pairs as `sorted` does, three times as fast as comparing `Action`s."""
    (a, g), _ = item
    return a.stage, a.kind, a.microbatch, g


_SOLVER_NAME = {"cbc": "CBC", "highs": "HiGHS"}


def _lp_floor(dag: PipelineDag, solver: SolverName) -> float:
    """Seconds the LP relaxation takes at least with `solver` (`LP_SECONDS_PER_PAIR2`,
    `CBC_LP_SECONDS_PER_PAIR2`)."""
    per = CBC_LP_SECONDS_PER_PAIR2 if solver == "cbc" else LP_SECONDS_PER_PAIR2
    return per * (dag.n_stages * dag.n_microbatches) ** 2


def _more_time(
    solver: SolverName, dag: PipelineDag | None = None, left: float | None = None
) -> str:
    """The hint for an LP out of time: more of it, or (from CBC) the faster solver — and, where
    `dag` and the time `left` say that even HiGHS would most likely not finish, how long it takes."""
    hint = "raise --time-limit"
    if solver != "cbc":
        return hint
    if dag is not None and left is not None:
        highs = _lp_floor(dag, "highs")
        if highs >= 1.0 and highs > LP_FLOOR_SHARE * left:
            return f"{hint} (also with --solver highs, far faster on large LPs: {_secs(highs)} or more)"
    return hint + ", or use --solver highs (far faster on large LPs)"


def _secs(s: float) -> str:
    """Seconds for a message: tenths below 10 s, thousandths below 0.1 s."""
    if s < 0.1:
        return f"{s:.3f} s"
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())


def _pwl(loss: tuple[float, ...], k: float) -> float:
    """Piecewise-linear interpolation of `loss` at count `k`."""
    k = min(max(k, 0.0), len(loss) - 1)
    j = min(math.floor(k), len(loss) - 2) if len(loss) > 1 else 0
    if len(loss) == 1:
        return loss[0]
    return loss[j] + (loss[j + 1] - loss[j]) * (k - j)


def _clip(v: float | None) -> float:
    return 0.0 if v is None else min(1.0, max(0.0, float(v)))


def _other(s: SolverName) -> SolverName:
    return "highs" if s == "cbc" else "cbc"
