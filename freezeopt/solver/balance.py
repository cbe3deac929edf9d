"""Planning without the LP: a lower bound on the step time and a start for the search, from rank loads.

Why: at 64 stages × 256 microbatches the LP relaxation takes 70–155 s with HiGHS. When it cannot
finish in the time limit, the heuristic still owes an answer and an honest bound on how far that
answer can be from the best plan. Both come from one observation, in well under a second there.

The bound. A rank runs its actions one at a time. For any run `u..v` of a rank's actions (program
order), `T ≥ est(u) + Σ_{u..v} d + tail(v)`, where `est(u)` is the longest path into `u` and
`tail(v)` the longest path out of `v`, both timed with every group frozen everywhere (durations
only get longer than that). Freezing shortens the run by at most all the rank's freezing,
`Σ_{(s,g) on the rank} c[s,g]·k[s,g]`. So with `need_r` the largest such run total without
freezing, `T ≥ need_r − Σ c·k` on every rank, for any plan the LP allows, and the LP optimum is
at least the least level `τ` at which every rank can be brought down to `τ` within the budget and
the group caps (stage caps left out: a relaxation). Per rank, the cheapest way to cut `R` ms is a
fractional knapsack over the segments of the convex loss curves (cheapest signal per ms first), so
`τ` is found by bisection. Tight where ranks are busy (ZBVZeroBubble: 0.16 % under the LP bound at
64×256); loose where the schedule has bubbles the windows miss (1F1B: about 3 % under).

The start: the same allocation in whole microbatches (freeze in the rank with the highest level
first, the group with the least signal per ms saved first, while the budget and caps allow), then
placed in each group's microbatches evenly spread or from both ends of the step (warm-up and
cool-down, where 1F1B's critical path runs), whichever the simulator times faster. The search
(`freezeopt.solver.search`) improves it from there.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np

from freezeopt.model.dag import PipelineDag
from freezeopt.solver.problem import FreezeProblem, Key

__all__ = ["balanced_plan", "rank_bound", "rank_needs"]

Loss = Mapping[tuple[int, int], Sequence[float]]


def rank_needs(problem: FreezeProblem) -> np.ndarray:
    """Per rank: the largest `est(u) + Σ_{u..v} d + tail(v)` over runs of its actions, with the
    run's own actions unfrozen and the paths into and out of it fully frozen."""
    dag, timer = problem.dag, problem.timer
    idx, base = timer.idx, timer.base
    floor = timer.floor  # every group frozen; not clipped at 0: the LP does not clip either
    span, start, end, _ = timer.times(floor)
    tail = span - end - timer.slack(floor, end, span)  # longest path after each action's end
    out = np.empty(len(dag.rank_actions))
    for r, acts in enumerate(dag.rank_actions):
        pos = np.fromiter((idx[a] for a in acts), dtype=np.int64, count=len(acts))
        pre = np.concatenate(([0.0], np.cumsum(base[pos])))
        best_u = np.maximum.accumulate(start[pos] - pre[:-1])  # best run start up to each v
        out[r] = float(np.max(best_u + pre[1:] + tail[pos]))
    return out


def _rank_pairs(dag: PipelineDag, pairs: Sequence[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    stage_rank = {a.stage: r for r, acts in enumerate(dag.rank_actions) for a in acts}
    out: list[list[tuple[int, int]]] = [[] for _ in dag.rank_actions]
    for sg in sorted(pairs):
        out[stage_rank[sg[0]]].append(sg)
    return out


def rank_bound(problem: FreezeProblem, need: np.ndarray) -> float:
    """A lower bound on the LP relaxation's step time (and so on every plan's) under the budget
    and group caps; see the module docstring. `need` is `rank_needs`."""
    dag, loss, kmax, budget = problem.dag, problem.loss, problem.kmax, problem.opts.budget
    pairs = list(problem.by_group)  # the (stage, group)s that can freeze
    curves = []  # per rank: cumulative ms cut and cumulative signal, cheapest segments first
    for sgs in _rank_pairs(dag, pairs):
        gain, cost = [], []
        for s, g in sgs:
            c = dag.group_cost[s][g]
            steps = np.diff(np.asarray(loss[(s, g)][: kmax + 1], dtype=float))
            gain.append(np.full(len(steps), c))
            cost.append(steps)
        if not gain:
            curves.append((np.zeros(1), np.zeros(1)))
            continue
        gs, cs = np.concatenate(gain), np.concatenate(cost)
        order = np.argsort(cs / gs, kind="stable")
        curves.append(
            (
                np.concatenate(([0.0], np.cumsum(gs[order]))),
                np.concatenate(([0.0], np.cumsum(cs[order]))),
            )
        )

    def signal_for(level: float) -> float:
        total = 0.0
        for need_r, (cut, sig) in zip(need, curves, strict=True):
            want = need_r - level
            if want <= 0:
                continue
            if want > cut[-1]:
                return math.inf
            total += float(np.interp(want, cut, sig))
        return total

    lo = max(float(need_r - cut[-1]) for need_r, (cut, _) in zip(need, curves, strict=True))
    hi = float(need.max())
    if signal_for(lo) <= budget:
        return lo
    for _ in range(100):  # lo: more signal than the budget; hi: within it
        mid = 0.5 * (lo + hi)
        if signal_for(mid) <= budget:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(1.0, hi):
            break
    return lo


def balanced_plan(problem: FreezeProblem, need: np.ndarray) -> dict[Key, float]:
    """A plan in whole microbatches that lowers the highest rank first; see the module
    docstring. `need` is `rank_needs`. Within budget, group caps and stage caps by construction."""
    dag, timer, by_group, loss = problem.dag, problem.timer, problem.by_group, problem.loss
    kmax, budget, stage_share = problem.kmax, problem.opts.budget, problem.stage_share
    stage_cap = problem.stage_load_cap
    per_rank = _rank_pairs(dag, list(by_group))
    counts = _whole_counts(
        dag, need, per_rank, loss, kmax=kmax, budget=budget, stage_share=stage_share,
        stage_cap=stage_cap,
    )  # fmt: skip
    in_order = {
        sg: sorted(keys, key=lambda k: (k[0].microbatch, k[0].kind))
        for sg, keys in sorted(by_group.items())
    }
    best_plan: dict[Key, float] = {}
    best_span = math.inf
    for place in (_spread, _ends):
        plan = {k: 1.0 for sg, keys in in_order.items() for k in place(keys, counts[sg])}
        span = timer.times(np.maximum(timer.durations(plan), 0.0))[0]
        if span < best_span - 1e-9:
            best_plan, best_span = plan, span
    return best_plan


def _whole_counts(
    dag: PipelineDag,
    need: np.ndarray,
    per_rank: Sequence[Sequence[tuple[int, int]]],
    loss: Loss,
    *,
    kmax: int,
    budget: float,
    stage_share: Mapping[tuple[int, int], float],
    stage_cap: float,
    sort: bool = True,
) -> dict[tuple[int, int], int]:
    """The start's group counts, a unit at a time: the highest rank (ties: the lower rank) takes
    its unit with the least signal per ms saved (ties: the group first in stage, group order),
    until that unit does not fit the budget or the rank has none left. Without stage caps the
    same counts come from sorting (`_sorted_counts`; `sort=False` runs the loop anyway)."""
    if sort and math.isinf(stage_cap):
        counts = _sorted_counts(dag.group_cost, need, per_rank, loss, kmax, budget)
        if counts is not None:
            return counts
    level = need.copy()
    counts = {sg: 0 for sgs in per_rank for sg in sgs}
    per_stage: dict[int, float] = {}
    signal = 0.0
    heap = [(-float(x), r) for r, x in enumerate(level)]
    heapq.heapify(heap)
    while heap:
        _, r = heapq.heappop(heap)
        best: tuple[float, tuple[int, int], float] | None = None
        for s, g in per_rank[r]:
            n = counts[(s, g)] + 1
            if n > kmax or per_stage.get(s, 0.0) + stage_share[(s, g)] > stage_cap:
                continue
            step = loss[(s, g)][n] - loss[(s, g)][n - 1]
            ratio = step / dag.group_cost[s][g]
            if best is None or ratio < best[0]:
                best = (ratio, (s, g), step)
        if best is None or signal + best[2] > budget + 1e-9:
            break  # the highest rank cannot come down: no other rank's freezing would help
        _, sg, step = best
        counts[sg] += 1
        signal += step
        per_stage[sg[0]] = per_stage.get(sg[0], 0.0) + stage_share[sg]
        level[r] -= dag.group_cost[sg[0]][sg[1]]
        heapq.heappush(heap, (-float(level[r]), r))
    return counts


def _sorted_counts(
    group_cost: Sequence[Sequence[float]],
    need: np.ndarray,
    per_rank: Sequence[Sequence[tuple[int, int]]],
    loss: Loss,
    kmax: int,
    budget: float,
) -> dict[tuple[int, int], int] | None:
    """`_whole_counts`'s loop without stage caps, on arrays (at 64×256 the loop took 0.1 s of a
    2 s solve). Each rank's units come in a fixed order (its groups' loss curves are convex, so a
    group's ratios only rise: a stable sort by ratio), and the loop takes units in the order of
    the rank's level before each (highest first, ties to the lower rank), so the same counts come
    from sorting every unit by that level and stopping at the first unit that does not fit the
    budget or the first rank left without units. The levels and the signal are summed in the
    loop's order, so the comparisons are the loop's. None (the loop decides) where a group's cost
    is not positive, its curve is shorter than `kmax` units or not convex, or a ratio not finite."""
    lv, rk, sq, sig, grp = [], [], [], [], []
    pairs: list[tuple[int, int]] = []
    for r, sgs in enumerate(per_rank):
        ratio, gain, step, who = [], [], [], []
        for s, g in sgs:
            c = float(group_cost[s][g])
            steps = np.diff(np.asarray(loss[(s, g)][: kmax + 1], dtype=float))
            if c <= 0 or len(steps) < kmax or np.any(np.diff(steps) < 0):
                return None  # (a curve that is not convex: its ratios do not only rise)
            ratio.append(steps / c)
            gain.append(np.full(kmax, c))
            step.append(steps)
            who.append(np.full(kmax, len(pairs)))
            pairs.append((s, g))
        if not ratio:
            lv.append(np.array([need[r]]))  # a rank with nothing to freeze: it stops the loop
            rk.append(np.array([r]))
            sq.append(np.array([0]))
            sig.append(np.array([np.inf]))
            grp.append(np.array([-1]))
            continue
        rt = np.concatenate(ratio)
        if not np.all(np.isfinite(rt)):
            return None
        # stable: ties to the groups in stage, group order, a group's units in order
        order = np.argsort(rt, kind="stable")
        cut = np.concatenate(gain)[order]
        # the level before each unit, and after the last (where the rank has none left)
        before = np.subtract.accumulate(np.concatenate(([need[r]], cut)))
        lv.append(before)
        rk.append(np.full(len(before), r))
        sq.append(np.arange(len(before)))
        sig.append(np.append(np.concatenate(step)[order], np.inf))  # none left: never fits
        grp.append(np.append(np.concatenate(who)[order], -1))
    levels, ranks, seq = np.concatenate(lv), np.concatenate(rk), np.concatenate(sq)
    signal, group = np.concatenate(sig), np.concatenate(grp)
    order = np.lexsort((seq, ranks, -levels))  # highest level first, ties to the lower rank
    steps = signal[order]
    total = np.add.accumulate(np.where(np.isfinite(steps), steps, 0.0))
    # the loop's test: the signal so far plus this unit's over the budget
    before_total = np.concatenate(([0.0], total[:-1]))
    stop = np.flatnonzero(~np.isfinite(steps) | (before_total + steps > budget + 1e-9))
    taken = group[order[: stop[0] if len(stop) else len(order)]]
    n = np.bincount(taken, minlength=len(pairs))
    return {sg: int(n[i]) for i, sg in enumerate(pairs)}


def _spread(keys: Sequence[Key], k: int) -> list[Key]:
    n = len(keys)
    return [keys[int((i + 0.5) * n / k)] for i in range(k)]


def _ends(keys: Sequence[Key], k: int) -> list[Key]:
    n = len(keys)
    return [keys[i // 2] if i % 2 == 0 else keys[n - 1 - i // 2] for i in range(k)]
