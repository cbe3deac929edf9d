"""The LP relaxation approximated without an LP solver: a fractional plan and a proven lower bound.

Why: at 64 stages × 256 microbatches HiGHS needs 1.5–3 minutes for the LP relaxation. When it
cannot finish in the time limit, the heuristic still needs a start for its search and a bound on
how far its answer can be from the best plan. `freezeopt.balance` gives both from rank loads in
well under a second; this module gives better ones the longer it runs (measured: 1F1B 64×256, a
bound 0.6 % under the LP optimum after 20 s where the rank-load bound is 3.3 % under).

The problem is the LP's phase 1: minimise the step time `T(x)`, the longest path with durations
`d_a = D_a − Σ_g c_ag·x_ag`, over the plans `x ∈ [0, 1]` whose group counts `k_g = Σ_a x_ag` keep
the group cap, the stage caps and `Σ_g loss_g(k_g) ≤ budget`. `T` is convex (a maximum of path
lengths, each linear in `x`) and so is the set of plans (the loss curves are convex).

Method: Frank–Wolfe on a smoothed step time. Each maximum of the longest-path recursion becomes a
soft maximum at temperature `τ` (`start_v = τ·log Σ_u exp((end_u + lag_uv)/τ)`); its gradient
`∂T_τ/∂d_a = p_a` is the probability that a path drawn from the Gibbs distribution over
source-to-sink paths (weight `exp(length/τ)`) runs through `a`: one forward and one backward pass
over the DAG, compiled with numba. The linear step is a fractional knapsack: per group, its
microbatches with the largest `p_a·c` first; across groups, units by time saved per signal spent
until the budget is spent (greedily within stage caps). The step length backtracks on `T_τ`, and
`τ` falls geometrically from 1 % to 0.01 % of the unfrozen step time.

The bound holds at every iteration, for any `τ`: for a distribution `π` over paths with action
marginals `p` and edge marginals `q`, every plan has `T(x) ≥ Σ_P π_P·len_P(x) = Σ_a p_a·D_a +
Σ_e q_e·lag_e − Σ_ag p_a·c_ag·x_ag`, and the knapsack's value (without stage caps: larger, so
still a bound) is the largest that last sum gets. The largest bound over the iterations is kept.
It is a bound on the LP optimum, so on every plan.

The fractional plan is rounded and searched by `freezeopt.solve`. Its rounding loses more than
an LP vertex's (most of an LP vertex's values are 0 or 1; Frank–Wolfe averages many vertices), so
the solve keeps whichever start, this one's or the rank-balanced one, times faster.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from freezeopt.actions import Action
from freezeopt.dag import PipelineDag
from freezeopt.simulate import Timer

__all__ = ["Relaxation", "load_relax_passes", "relax"]

Key = tuple[Action, int]
Loss = Mapping[tuple[int, int], Sequence[float]]

TAU_START = 1e-2
TAU_END = 1e-4
"""`τ` starts at `TAU_START` and ends at `TAU_END` times the unfrozen step time."""
TAU_FALLS_BY = 0.3
"""`τ` reaches its end after this share of the iterations the time allows (first iteration's pace)."""
HARD_EVERY = 10
"""Iterations between timing the fractional plan exactly (the best one is kept)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Relaxation:
    """A fractional plan within budget and caps, and a lower bound on every plan's step time."""

    plan: dict[Key, float]
    """Frozen extent of each (action, group) in (0, 1] (absent: 0)."""
    bound: float
    """A lower bound on the LP relaxation's optimum (ms), so on every plan's step time."""
    makespan: float
    """`plan`'s step time (ms), durations clipped at zero as the simulator clips them."""
    iterations: int


@functools.cache
def _passes() -> tuple[Any, Any, Any]:
    """The compiled soft passes and the knapsack (numba imported on first use)."""
    from numba import njit

    def jit(fn: Any) -> Any:
        try:
            return njit(cache=True)(fn)
        except RuntimeError:  # no cache location: compile in each process
            return njit(fn)

    @jit
    def soft_forward(d, ptr, src, lag, sinks, tau):
        n = d.shape[0]
        start = np.zeros(n)
        end = np.zeros(n)
        for v in range(n):
            if ptr[v] < ptr[v + 1]:
                m = -1e300
                for j in range(ptr[v], ptr[v + 1]):
                    r = end[src[j]] + lag[j]
                    if r > m:
                        m = r
                s = 0.0
                for j in range(ptr[v], ptr[v + 1]):
                    s += math.exp((end[src[j]] + lag[j] - m) / tau)
                start[v] = m + tau * math.log(s)
            end[v] = start[v] + d[v]
        m = -1e300
        for v in sinks:
            if end[v] > m:
                m = end[v]
        s = 0.0
        for v in sinks:
            s += math.exp((end[v] - m) / tau)
        return m + tau * math.log(s), start, end

    @jit
    def soft_backward(start, end, span, ptr, src, lag, sinks, tau):
        n = end.shape[0]
        p = np.zeros(n)
        for v in sinks:
            p[v] = math.exp((end[v] - span) / tau)
        elag = 0.0
        for v in range(n - 1, -1, -1):
            pv = p[v]
            if pv == 0.0:
                continue
            for j in range(ptr[v], ptr[v + 1]):
                u = src[j]
                f = pv * math.exp((end[u] + lag[j] - start[v]) / tau)
                p[u] += f
                elag += f * lag[j]
        return p, elag

    @jit
    def knapsack(ratio, slope, unit_stage, unit_share, order, room, stage_room):
        # units in `order` (best ratio first); returns the amount of each unit taken
        take = np.zeros(ratio.shape[0])
        load = np.zeros(stage_room.shape[0])
        for u in order:
            if ratio[u] <= 0.0 or room <= 0.0:
                break
            s = unit_stage[u]
            if load[s] + unit_share[u] > stage_room[s]:
                continue
            amount = 1.0
            if slope[u] > 0.0:
                amount = min(1.0, room / slope[u])
                room -= amount * slope[u]
            take[u] = amount
            load[s] += amount * unit_share[u]
        return take

    return soft_forward, soft_backward, knapsack


def load_relax_passes() -> None:
    """Load (the first time on a machine: compile) the compiled passes now (about 1 s to compile,
    then a fraction of that to load from the cache)."""
    fwd, bwd, knap = _passes()
    d, ptr, none, lag = np.ones(1), np.zeros(2, dtype=np.int64), np.zeros(0, np.int64), np.zeros(0)
    sinks = np.zeros(1, dtype=np.int64)
    span, start, end = fwd(d, ptr, none, lag, sinks, 1.0)
    bwd(start, end, span, ptr, none, lag, sinks, 1.0)
    one = np.ones(1)
    knap(one, one, sinks, one, sinks, 1.0, one)


class _Knapsack:
    """The linear step: the plan that saves the most `Σ p_a·c_ag·x_ag` within budget and caps."""

    def __init__(
        self,
        dag: PipelineDag,
        timer: Timer,
        by_group: Mapping[tuple[int, int], Sequence[Key]],
        loss: Loss,
        kmax: int,
        budget: float,
        stage_share: Mapping[tuple[int, int], float],
        stage_cap: float,
    ):
        groups = sorted(by_group)
        self.keys: list[Key] = []
        width = max((len(by_group[sg]) for sg in groups), default=0)
        self.kmax = kmax = min(kmax, width)
        ng = len(groups)
        self.mat = np.full((ng, width), -1, dtype=np.int64)  # key positions; −1 pads
        slope = np.full((ng, kmax), np.inf)  # past a curve's end: never taken
        loss0 = 0.0
        for i, sg in enumerate(groups):
            ks = sorted(by_group[sg], key=lambda k: (k[0].microbatch, k[0].kind))
            self.mat[i, : len(ks)] = np.arange(len(self.keys), len(self.keys) + len(ks))
            self.keys.extend(ks)
            curve = np.asarray(loss[sg][: kmax + 1], dtype=float)
            slope[i, : len(curve) - 1] = np.diff(curve)
            loss0 += float(curve[0])
        self.key_act = np.array([timer.idx[a] for a, _ in self.keys], dtype=np.int64)
        self.key_c = np.array([dag.group_cost[a.stage][g] for a, g in self.keys], dtype=float)
        self.slope = slope.ravel()
        self.room = budget - loss0
        stages = sorted({s for s, _ in groups})
        sid = {s: i for i, s in enumerate(stages)}
        self.unit_stage = np.repeat(np.array([sid[s] for s, _ in groups], dtype=np.int64), kmax)
        self.unit_share = np.repeat(np.array([stage_share[sg] for sg in groups]), kmax)
        self.capped = np.full(len(stages), stage_cap)
        self.uncapped = np.full(len(stages), np.inf)

    def solve(self, p: np.ndarray) -> tuple[np.ndarray, float, float]:
        """For action weights `p`: the best plan within budget and caps, its value, and the best
        value without stage caps (at least as large: what the bound needs)."""
        _, _, knapsack = _passes()
        n_keys, kmax = len(self.keys), self.kmax
        benefit = np.append(p[self.key_act] * self.key_c, -1.0)  # the pad's benefit: −1
        b = benefit[self.mat]  # −1 at pads (index −1 is the appended entry)
        order = np.argsort(-b, axis=1, kind="stable")[:, :kmax]
        top = np.take_along_axis(b, order, axis=1).ravel()
        which = np.take_along_axis(self.mat, order, axis=1).ravel()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(self.slope > 0, top / self.slope, np.inf)
        ratio[top <= 0] = -1.0
        units = np.argsort(-ratio, kind="stable")
        take = knapsack(
            ratio, self.slope, self.unit_stage, self.unit_share, units, self.room, self.capped
        )
        x = np.zeros(n_keys)
        on = take > 0
        x[which[on]] = take[on]
        value = float(top[on] @ take[on])
        if np.isfinite(self.capped).any():
            free = knapsack(
                ratio, self.slope, self.unit_stage, self.unit_share, units, self.room, self.uncapped
            )
            value_free = float(top[free > 0] @ free[free > 0])
        else:
            value_free = value
        return x, value, value_free


def relax(
    dag: PipelineDag,
    timer: Timer,
    by_group: Mapping[tuple[int, int], Sequence[Key]],
    loss: Loss,
    *,
    kmax: int,
    budget: float,
    stage_share: Mapping[tuple[int, int], float],
    stage_cap: float,
    deadline: float,
    max_iterations: int = 100_000,
) -> Relaxation:
    """Frank–Wolfe on the smoothed step time until `deadline` (`time.perf_counter()`) or
    `max_iterations`; see the module docstring. `stage_cap` bounds a stage's frozen microbatches
    weighted by `stage_share` (inf: none)."""
    fwd, bwd, _ = _passes()
    ks = _Knapsack(dag, timer, by_group, loss, kmax, budget, stage_share, stage_cap)
    ptr, src, lag = timer._pred
    n = len(timer.order)
    sinks = np.flatnonzero(np.bincount(src, minlength=n) == 0).astype(np.int64)
    base = timer.base
    key_act, key_c = ks.key_act, ks.key_c

    def durations(x: np.ndarray) -> np.ndarray:
        return base - np.bincount(key_act, weights=key_c * x, minlength=n)

    def hard(x: np.ndarray) -> float:
        return timer.times(np.maximum(durations(x), 0.0))[0]

    def kept(x: np.ndarray) -> np.ndarray:  # what a plan holds: extents above 1e-9
        return np.where(x > 1e-9, x, 0.0)

    x = np.zeros(len(ks.keys))
    t_free = hard(x)
    best_x, best_t, bound = x, t_free, -math.inf
    if not len(ks.keys) or ks.room <= 0 or t_free <= 0:
        no_bound = t_free if not len(ks.keys) else -math.inf
        return Relaxation(plan={}, bound=no_bound, makespan=t_free, iterations=0)
    tau = TAU_START * t_free
    tau_end = TAU_END * t_free
    fall = 0.0  # set after the first iteration, from its pace
    step = 0.5
    it = 0
    t0 = time.perf_counter()
    while it < max_iterations:
        now = time.perf_counter()
        if it and now + (now - t0) / it > deadline:
            break
        d = durations(x)
        span, start, end = fwd(d, ptr, src, lag, sinks, tau)
        p, elag = bwd(start, end, span, ptr, src, lag, sinks, tau)
        s, value, value_free = ks.solve(p)
        bound = max(bound, float(p @ base) + elag - value_free)
        benefit = p[key_act] * key_c
        gap = value - float(benefit @ x)  # Frank–Wolfe gap of the smoothed problem (≥ 0)
        if gap > 1e-12 * t_free:
            direction = s - x
            g = min(1.0, 2.0 * step)
            while g > 1e-6:
                trial = x + g * direction
                if fwd(durations(trial), ptr, src, lag, sinks, tau)[0] <= span - 0.5 * g * gap:
                    break
                g *= 0.5
            else:
                g = 0.0
            if g > 0.0:
                x = trial
                step = g
        it += 1
        if it == 1:
            left = max(deadline - time.perf_counter(), 0.0)
            pace = max(time.perf_counter() - t0, 1e-6)
            expect = min(max_iterations, left / pace)
            fall = (tau_end / tau) ** (1.0 / max(1.0, TAU_FALLS_BY * expect))
        tau = max(tau * fall, tau_end)
        if it % HARD_EVERY == 0:
            t = hard(c := kept(x))
            if t < best_t:
                best_x, best_t = c, t
    t = hard(c := kept(x))
    if t < best_t:
        best_x, best_t = c, t
    plan = {ks.keys[i]: float(best_x[i]) for i in np.flatnonzero(best_x).tolist()}
    return Relaxation(plan=plan, bound=bound, makespan=best_t, iterations=it)
