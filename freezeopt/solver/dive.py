"""LP diving: the `milp` mode's second warm start, and the LP's plan rounded down.

Why: a MILP solver with a time limit is only as good as the plan it starts from. Rounding the LP
relaxation once (`round_down`, the heuristic's start) cannot re-balance around its own choices;
a dive re-solves the LP with more keys fixed each round, so the LP moves the rest of the plan
around what is fixed, until no key is fractional (`dive`). `dives` runs up to two dives from
different optimal vertices of the (degenerate) LP and keeps the faster plan after
`freezeopt.solver.search`. `freezeopt.solver.modes` hands the better of this and the rounded plan to the MILP.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import numpy as np

from freezeopt.errors import SolverError
from freezeopt.solver.lp_arrays import FastLP
from freezeopt.solver.problem import Deadline, FreezeProblem, Key, Spent
from freezeopt.solver.search import search

__all__ = ["DIVE_STEP", "dive", "dives", "round_down"]


DIVE_STEP = 0.02
"""Share of the LP's fractional keys that one round of LP diving fixes at frozen, at least (more
when that pace would not finish the dive by its deadline)."""
_EPS = 1e-6


def dives(
    problem: FreezeProblem,
    lp: FastLP | None,
    clock: Deadline,
    search_clock: Deadline,
    spent: Spent | None = None,
) -> dict[Key, float]:
    """The faster of up to two LP dives, each followed by `search`: the first from the LP
    relaxation just solved (when its HiGHS model can be taken over), the second, with time left
    on `clock`, from a model of its own solved cold. The LP is degenerate: the two start from
    different optimal vertices and end in different plans (on 8 instances up to 16×64 each was
    the faster on some; the first saves a cold solve, 1.4 s at 16×64 and 5 s at 32×128).
    `lp` is the solved LP to take over (None: none to take); solver time is added to `spent`
    where one is given."""
    best: dict[Key, float] = {}
    for start in (lp, None) if lp is not None else (None,):
        if clock.passed():
            break
        plan = dive(problem, clock, start, spent=spent)
        if not plan:
            continue
        plan = search(problem, plan, search_clock)
        if not best or problem.makespan(plan) < problem.makespan(best) - 1e-9:
            best = plan
    return best


def dive(
    problem: FreezeProblem,
    clock: Deadline,
    lp: FastLP | None = None,
    *,
    spent: Spent | None = None,
) -> dict[Key, float]:
    """LP diving, the `milp` mode's second start.

    Re-solve phase 1 of the LP relaxation (`lp`, solved and taken over, or a model of its own;
    from the last basis) with more keys fixed each round until none is fractional. Each round
    fixes at frozen the fractional keys whose LP share saves the most time (`x·cost`; `DIVE_STEP`
    of them, or as many as the time per round so far says the deadline needs) while budget and
    caps hold beside the keys the LP freezes fully, and fixes at not frozen those that no longer
    fit there. The LP re-balances around each round's choices, which one rounding cannot.

    The plan is the last LP rounded down per group (`round_down`): once none is fractional, the
    keys it freezes; past `clock`'s deadline, a partial dive's LP rounded. With no time for the
    first LP, the plan is empty.

    Measured (HiGHS, then `search`; 1F1B 16×64 with 8 groups from the benchmark's profile): 0.47 %
    from the LP bound in 7.0 s, against 0.52 % in 6.0 s fixing 5 % a round, and 0.53 % in 13.6 s
    when every round also ran phase 2 and restarted from phase 1's saved basis (each restart
    refactorised the basis; the rounds' bookkeeping in dicts was a third of the rest). Ordered by
    `x` alone rather than `x·cost`, the dive ended further from the LP bound on 8 of 9 1F1B,
    Interleaved1F1B and ZBV instances up to 16×64. At 1F1B 32×128 with 4 groups a whole dive
    takes 33.5 s (1.43 %); a 60 s `milp` paces its dives to their share and ends at 1.47 %, the
    heuristic at 2.02 %.

    Solver time is added to `spent` where one is given."""
    o, ix = problem.opts, problem.index
    spent = spent if spent is not None else Spent()
    t0 = time.perf_counter()
    try:
        lp = lp or FastLP.for_problem(problem)
        lp.method = "simplex"  # rounds re-solve from the last basis, never by interior point
        ans = lp.solve(time_limit=clock.left(), phase2=False)
    except SolverError:
        return {}
    finally:
        spent.solver += time.perf_counter() - t0
    group = ix.group_a
    began, rounds = time.perf_counter(), 0
    while not clock.passed():
        x = ans.values
        ones = x >= 1 - _EPS
        frac = np.flatnonzero((x > _EPS) & ~ones)
        if not len(frac):
            break
        counts, signal, per_stage, stage_cap = problem.tally(ones)
        take = math.ceil(DIVE_STEP * len(frac))
        if rounds:  # fix more per round when DIVE_STEP's pace would not finish by the deadline
            per_round = (time.perf_counter() - began) / rounds
            take = max(take, math.ceil(len(frac) * per_round / max(clock.left(), 1e-9)))
        rounds += 1
        pick: list[int] = []
        drop: list[int] = []
        # most time saved first (x·cost), ties by action name, then group
        order = np.lexsort((group[frac], ix.rank_a[ix.act[frac]], -x[frac] * ix.cost[frac]))
        for i in frac[order].tolist():
            p = int(ix.sg_id[i])
            n = int(counts[p]) + 1
            s = int(ix.pair_stage[p])
            fits = (
                n <= problem.kmax
                and per_stage[s] + ix.pair_share[p] <= stage_cap
                and signal + ix.marginal[p, n] <= o.budget + 1e-9
            )
            if not fits:
                drop.append(i)
            elif len(pick) < take:
                pick.append(i)
                counts[p] = n
                per_stage[s] += ix.pair_share[p]
                signal += ix.marginal[p, n]
        lp.fix(ones=pick, zeros=drop)
        t0 = time.perf_counter()
        try:
            ans = lp.solve(time_limit=clock.left(), phase2=False)
        except SolverError:  # out of time: the last LP stands
            break
        finally:
            spent.solver += time.perf_counter() - t0
    return round_down(problem, ans.x)


def round_down(problem: FreezeProblem, lp_x: Mapping[Key, float]) -> dict[Key, float]:
    """Per group, freeze the LP's count rounded down, in the microbatches the LP froze most."""
    plan: dict[Key, float] = {}
    for _sg, keys in sorted(problem.by_group.items()):
        k_star = sum(lp_x.get(k, 0.0) for k in keys)
        n = min(math.floor(k_star + 1e-6), problem.kmax)
        ranked = sorted(keys, key=lambda k: (-lp_x.get(k, 0.0), k[0].microbatch))
        for k in ranked[:n]:
            plan[k] = 1.0
    while not problem.fits(plan) and plan:  # rounding down keeps the budget; guard numerical drift
        worst = max(plan, key=lambda k: (problem.loss[(k[0].stage, k[1])][1], k))
        del plan[worst]
    return plan
