"""How a solve shares its time limit: what the LP needs at least, what each strategy gets.

Why its own module: `solve` decides from these figures which strategies run at all (an LP that
cannot finish is not started), and the PuLP driver's error hints quote the same figures. The
figures are floors and shares measured on this project's benchmark machine; the runs behind each
are in benchmarks/solver.md (the session named beside it) and docs/solver.md.
"""

from __future__ import annotations

import time

from freezeopt.model.dag import PipelineDag
from freezeopt.solver.problem import SolverName

__all__ = [
    "CBC_LP_SECONDS_PER_PAIR2",
    "IPM_FROM",
    "LP_BUILD_PER_TIMER",
    "LP_FLOOR_SHARE",
    "LP_SECONDS_PER_PAIR2",
    "LP_SHARE",
    "RELAXED_WITHIN",
    "RELAX_ABOVE_GAP",
    "RELAX_ITERATIONS",
    "RELAX_SECONDS_PER_ACTION",
    "RELAX_SHARE",
    "ROUND_SECONDS_PER_KEY",
    "SOLVER_NAME",
    "WRAP_UP",
    "lp_floor",
    "more_time",
    "seconds_left",
    "secs",
]

IPM_FROM = 3000
"""Actions from which PuLP's LP runs by interior point (with crossover, so phase 2 can start from a
basis): large LPs here are very degenerate, and simplex is 3× slower and more from this size."""
WRAP_UP = 0.1
"""Seconds of the time limit (at most 5 %) kept back from the solvers and the search, for reading
their answer back and re-timing it (15–70 ms at 16×64 with 8 groups, about 0.1 s at 64×256)."""
LP_SHARE = 0.8
"""Share of the time limit the `heuristic` mode gives the LP relaxation; the search has the rest
(from the LP's plan, or, when the LP does not solve in it, from a plan built without it)."""
LP_BUILD_PER_TIMER = 4.0
"""The LP's arrays take about this many times as long to build as the simulator's (2.4–4.1×
from 16×64 to 64×256): with less time than that left for the LP, `heuristic` skips it."""
LP_SECONDS_PER_PAIR2 = 1.5e-7
"""A floor on the LP relaxation's solve time with HiGHS, in seconds per (stage × microbatch)²
(pairs, not actions, so schedules with two or three actions a pair sit on one scale): every
measured solve took 1.5× this or longer (benchmarks/solver.md, runs L and M)."""
CBC_LP_SECONDS_PER_PAIR2 = 1e-6
"""The same floor through PuLP with CBC: every measured solve took 2.8× this or longer (session 21,
run A). 268 s at 64×256: `milp` and `lp` with CBC and the default 60 s fail at once there."""
LP_FLOOR_SHARE = 0.5
"""The LP is tried (by `heuristic`, and by `milp`/`lp` with `fallback="heuristic"`) only when its
floor is at most this share of the time it would get: the floor is 1.5–2.8× under the measured
solves, so past half the share the LP would most likely not finish, and the time is better spent
without it. Without the fallback, `milp` and `lp` give up only where the floor exceeds all the
time left: the user asked for the LP."""
RELAX_ABOVE_GAP = 0.001
"""Without the LP, the first-order relaxation runs only when the rank-balanced start is proven
further than this from the rank-load bound; where it is proven optimal, or all but, the search's
time is worth more (session 17)."""
RELAX_SHARE = 0.45
"""Share of the time left that the first-order relaxation gets when the answer comes without the
LP, its rounding included; the search has the rest (session 20's side-by-side runs)."""
ROUND_SECONDS_PER_KEY = 5e-7
"""Rounding the relaxation's plan comes out of its share: 0.35–0.4 µs per key at 64×256."""
RELAXED_WITHIN = 0.02
"""The search starts from the relaxation's rounded plan unless the rank-balanced plan is faster by
more than this share: rounding down leaves part of the budget for the search to spend, which a
plan that spends it all cannot."""
RELAX_ITERATIONS = 40
RELAX_SECONDS_PER_ACTION = 1.5e-7
"""The relaxation runs only when its share of the time fits `RELAX_ITERATIONS` iterations at
`RELAX_SECONDS_PER_ACTION` per action each (0.07–0.11 µs measured, session 15); fewer would spend
the search's time on a worse start and a looser bound. A count of actions, not a clock, so the
choice does not move with the machine's load."""
SOLVER_NAME = {"cbc": "CBC", "highs": "HiGHS"}


def lp_floor(dag: PipelineDag, solver: SolverName) -> float:
    """Seconds the LP relaxation takes at least with `solver` (`LP_SECONDS_PER_PAIR2`,
    `CBC_LP_SECONDS_PER_PAIR2`)."""
    per = CBC_LP_SECONDS_PER_PAIR2 if solver == "cbc" else LP_SECONDS_PER_PAIR2
    return per * (dag.n_stages * dag.n_microbatches) ** 2


def more_time(solver: SolverName, dag: PipelineDag | None = None, left: float | None = None) -> str:
    """The hint for an LP out of time: more of it, or (from CBC) the faster solver — and, where
    `dag` and the time `left` say that even HiGHS would most likely not finish, how long it takes."""
    hint = "raise --time-limit"
    if solver != "cbc":
        return hint
    if dag is not None and left is not None:
        highs = lp_floor(dag, "highs")
        if highs >= 1.0 and highs > LP_FLOOR_SHARE * left:
            return (
                f"{hint} (also with --solver highs, far faster on large LPs: {secs(highs)} or more)"
            )
    return hint + ", or use --solver highs (far faster on large LPs)"


def secs(s: float) -> str:
    """Seconds for a message: tenths below 10 s, thousandths below 0.1 s."""
    if s < 0.1:
        return f"{s:.3f} s"
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def seconds_left(deadline: float) -> float:
    """Seconds until `deadline` (`time.perf_counter()`), 0 once past."""
    return max(0.0, deadline - time.perf_counter())
