"""The exact `lp` relaxation as sparse arrays handed to HiGHS in one call, and its warm re-solve.

What: the LP that `freezeopt.solver.modes` poses through PuLP — same variables, same two phases, same
optimum (makespan `T` and signal dropped) — assembled with numpy as one column-wise sparse matrix
and passed to highspy with `passModel`. Why: PuLP spends about a second per 10 k actions on Python
objects and HiGHS then re-reads them one row at a time; more importantly, solved as before, phase 2
(from phase 1's basis with dual simplex) took as many pivots as phase 1. PuLP stays the modelling
layer people inspect: `--write-model` still writes the PuLP model.

Exact reductions (each leaves the optimum unchanged):

* An edge `u → v` is left out when another in-edge `w → v` with `w` after `u` on `u`'s rank implies
  it: `t_v ≥ e_w + lag(w,v) ≥ e_u + Σ d_min(u < z ≤ w) + lag(w,v) ≥ e_u + lag(u,v)`, with `d_min`
  the action's duration with all of its freezable groups frozen. Same-rank local edges (`F → B`,
  `I → W`) always go; cross-rank ones where lags and durations allow.
* The group cap is a column bound and the convex piecewise-linear signal curve is carried by
  segment variables `y_j ∈ [0, 1]`, one per step of the count (`k = Σ_j y_j`, signal
  `= Σ_j slope_j·y_j`). Because the curve is convex, the cheapest segments fill first, so the
  signal any count needs is the curve's value there — the same as the PuLP model's "signal ≥
  every piece". Stage caps sit on the segments too (`Σ_j y_j` is the count).
* Signal is scaled by 1/budget inside the model, so HiGHS sees numbers near 1.

Solving. Phase 1 (minimise `T`) runs dual simplex from a crash basis: the spanning tree of the
edges that set each start time in the no-freeze timeline (every start time basic), which halves
the pivots of a slack start; from `IPM_FROM` actions on it runs interior point with crossover
instead, which wins there (simplex needs about 1.5 pivots per action, and each pivot costs more as
the DAG grows). Phase 2 (minimise signal with `T ≤ (1 + tolerance)·T1` plus the same
numerical slack as `freezeopt.solver.modes`) keeps phase 1's basis, which stays primal feasible, and runs
primal simplex: a handful of pivots. `solve(phase2=False)` runs phase 1 alone and leaves its
objective and basis loaded, so the next phase 1 after new bounds (`fix`, each round of the `milp`
mode's LP dive) starts from HiGHS's current factorisation: restoring phase 1's saved basis after a
phase 2 refactorises it, which took most of a dive round's time at 16×64.

Warm re-solve (`FastLP.resolve`): a DAG with the same schedule and new costs (actions, groups,
lags) updates right-hand sides and coefficients in place and re-runs both phases from the last
basis. If new costs break an edge reduction, the model is rebuilt (and solved cold). From
`IPM_FROM` actions the warm phase 1 gets a pivot budget (`WARM_PIVOTS` per action); past it the
model is solved cold by interior point, and so are its later re-solves: a model pays for one
failed warm attempt at most, while a run's re-plans (`LpCache`) make many warm re-solves. Measured
without a budget (benchmarks/solver.md run A): warm phase 1 took 0.43 pivots per action at ZBV
32×128 (3.0 s against 5.7 s cold), 0.63–0.96 at 32×256 (13.5–33.9 s against 31.5–39.6 s), 0.74
for 1F1B 64×256 (66 s against 122 s), and 1.06–1.27 for Interleaved1F1B and ZBV 64×256 (longer
than cold): the budget lets the first kinds finish; the last run out of it once, after
about 1.4–2.4 cold solves' time (from run A's pivot rates), and re-solve cold from then on.

`LpCache` keeps the last model of a sequence of solves — the online re-plans of one training run —
and re-solves it warm whenever only costs changed, cold otherwise.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from freezeopt.actions import Action
from freezeopt.errors import InputError, LpUnsolved, SolverError
from freezeopt.fileio import stdout_discarded, stdout_to_stderr
from freezeopt.model.dag import PipelineDag
from freezeopt.model.simulate import rank_prefix
from freezeopt.solver.problem import FreezeProblem, Key

__all__ = ["FastLP", "LpAnswer", "LpCache", "phase2_limit", "quiet_highs"]

Method = Literal["auto", "simplex", "ipm"]
IPM_FROM = 10000
"""Actions from which `auto` runs phase 1 by interior point (with crossover) instead of simplex."""
WARM_PIVOTS = 1.0
"""From `IPM_FROM` actions, a warm phase 1 may take this many simplex pivots per action before
the model is solved cold by interior point instead (and its later re-solves too)."""
WARM_MIN_PIVOTS = 100
"""A floor on that budget (with `WARM_PIVOTS` at 1 it does not bind from `IPM_FROM` actions on; it
keeps a lowered `WARM_PIVOTS` from leaving a warm solve almost no pivots)."""


def quiet_highs(threads: int) -> Any:
    """A new `highspy.Highs` that prints nothing, on `threads` threads. Its constructor prints a
    banner on file descriptor 1 before its output can be turned off, so that goes nowhere; HiGHS
    keeps one thread scheduler per process, and one made for another thread count fails the next
    solve ("scheduler has already been initialized"), so it is reset first."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    with stdout_discarded():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", threads)
    return h


def phase2_limit(t1: float, tolerance: float) -> float:
    """Phase-2 bound on the makespan: the phase-1 value, the tolerance, and numerical slack."""
    return t1 * (1 + tolerance) + 1e-7 * t1 + 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class LpAnswer:
    """Both phases of the LP relaxation."""

    t1: float
    """Phase-1 optimum: the smallest makespan any fractional plan reaches (ms)."""
    keys: Sequence[Key]
    """Every freezable (action, group), in the model's order."""
    values: np.ndarray
    """Frozen extent of each of `keys` in [0, 1]: phase 2's (phase 1's when phase 2 was skipped)."""
    signal: float
    """The signal `values` drop (share of one step's progress): phase 2's optimum, when it ran."""
    iterations: tuple[int, int]
    """Simplex pivots of phase 1 and phase 2."""
    build_seconds: float
    solver_seconds: float
    warm: bool
    """True when this answer came from a warm re-solve."""
    method: str = "simplex"
    """How phase 1 ran: `simplex` (dual, from the crash or last basis) or `ipm` (with crossover)."""

    @property
    def x(self) -> dict[Key, float]:
        """`values` by key."""
        return dict(zip(self.keys, self.values.tolist(), strict=True))


@dataclass(slots=True)
class _Arrays:
    """The model's numbers, kept to update it in place."""

    order: tuple[Action, ...]
    cost: np.ndarray  # D per action
    key_act: np.ndarray  # action index of each key
    key_c: np.ndarray  # weight-gradient cost of each key
    src: np.ndarray  # kept edges
    dst: np.ndarray
    lag: np.ndarray
    sinks: np.ndarray
    drop: np.ndarray  # (u, w, v) rows: edge u→v left out, implied by w→v
    x_row: np.ndarray  # matrix entries of x in precedence and sink rows: row, key
    x_key: np.ndarray
    cap_row: np.ndarray  # stage-cap entries: row, column, group index
    cap_col: np.ndarray
    cap_group: np.ndarray
    n_prec: int


class FastLP:
    """The LP relaxation of one DAG and option set, held in a HiGHS model for warm re-solves.

    `keys`, `loss` and `kmax` are those of a `FreezeProblem` (what may be frozen, each group's
    signal curve, the group cap as a count); each group's share of its stage's freezable time
    comes from the DAG. `for_problem` takes them from the problem.
    """

    def __init__(
        self,
        dag: PipelineDag,
        *,
        keys: Sequence[Key],
        loss: Mapping[tuple[int, int], tuple[float, ...]],
        kmax: int,
        budget: float,
        stage_cap: float | None,
        tolerance: float = 0.0,
        threads: int = 1,
        method: Method = "auto",
    ) -> None:
        self.keys = list(keys)
        self.loss = dict(loss)
        self.kmax = kmax
        self.budget = budget
        self.stage_cap = stage_cap
        self.tolerance = tolerance
        self.threads = threads
        self.method = method
        self.groups = sorted({(a.stage, g) for a, g in self.keys})
        self._h: Any = None
        self._basis1: Any = None
        self._in_phase2 = False
        """Whether phase 2's objective and T bound are loaded (phase 1 must restore them)."""
        self._solved = False
        self._warm_gave_up = False  # a warm phase 1 ran out of pivots: re-solve cold from now on
        self.info: dict[str, float] = {}
        self._build(dag)

    @classmethod
    def for_problem(cls, problem: FreezeProblem) -> FastLP:
        """Build from a problem (its DAG, keys, curves and options)."""
        o = problem.opts
        return cls(
            problem.dag,
            keys=problem.keys,
            loss=problem.loss,
            kmax=problem.kmax,
            budget=o.budget,
            stage_cap=o.stage_cap,
            tolerance=o.tolerance,
            threads=o.threads,
        )

    # -- building ------------------------------------------------------------------------------
    def _stage_share(
        self, group_cost: tuple[tuple[float, ...], ...]
    ) -> dict[tuple[int, int], float]:
        return {
            (s, g): c / sum(cs)
            for s, cs in enumerate(group_cost)
            for g, c in enumerate(cs)
            if c > 0
        }

    def _build(self, dag: PipelineDag) -> None:
        import highspy

        t0 = time.perf_counter()
        inf = highspy.kHighsInf
        order = dag.order
        n = len(order)
        idx = {a: i for i, a in enumerate(order)}
        cost = np.array([dag.cost[a] for a in order], dtype=float)
        K = len(self.keys)
        key_act = np.array([idx[a] for a, _ in self.keys], dtype=np.int64)
        key_c = np.array([dag.group_cost[a.stage][g] for a, g in self.keys], dtype=float)
        if K and not np.all(np.diff(key_act) >= 0):
            raise ValueError("keys must be grouped by action in DAG order")
        dmin = cost - np.bincount(key_act, weights=key_c, minlength=n)

        src, dst, lag, drop = _reduced_edges(dag, idx, dmin)
        sinks = np.array([i for i, a in enumerate(order) if not dag.graph.succ[a]], dtype=np.int64)
        E, S = len(src), len(sinks)

        kcount = np.bincount(key_act, minlength=n)
        kstart = np.concatenate([[0], np.cumsum(kcount)[:-1]]).astype(np.int64)
        gid = {sg: i for i, sg in enumerate(self.groups)}
        ng, kmax = len(self.groups), self.kmax
        ny = ng * kmax
        col_T = n + K
        col_y = col_T + 1
        ncol = col_y + ny

        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        # precedence rows: t_u − t_v − Σ c·x_u ≤ −(D_u + lag)
        er = np.arange(E, dtype=np.int64)
        rows += [er, er]
        cols += [src, dst]
        vals += [np.ones(E), -np.ones(E)]
        # sink rows: t_u − T − Σ c·x_u ≤ −D_u
        sr = E + np.arange(S, dtype=np.int64)
        rows += [sr, sr]
        cols += [sinks, np.full(S, col_T, dtype=np.int64)]
        vals += [np.ones(S), -np.ones(S)]
        owner = np.concatenate([src, sinks])  # the action whose x enters each of these rows
        owner_row = np.concatenate([er, sr])
        nk = kcount[owner]
        x_row = np.repeat(owner_row, nk)
        x_key = np.repeat(kstart[owner], nk) + (
            np.arange(int(nk.sum()), dtype=np.int64) - np.repeat(np.cumsum(nk) - nk, nk)
        )
        rows.append(x_row)
        cols.append(n + x_key)
        vals.append(-key_c[x_key])
        row_hi = [-(cost[src] + lag), -cost[sinks]]
        row_lo = [np.full(E + S, -inf)]
        r = E + S
        # count rows: Σ_m x − Σ_j y_j = 0 per group
        key_gid = np.array([gid[(a.stage, g)] for a, g in self.keys], dtype=np.int64)
        y_gid = np.repeat(np.arange(ng, dtype=np.int64), kmax)
        rows += [r + key_gid, r + y_gid]
        cols += [n + np.arange(K, dtype=np.int64), col_y + np.arange(ny, dtype=np.int64)]
        vals += [np.ones(K), -np.ones(ny)]
        row_lo.append(np.zeros(ng))
        row_hi.append(np.zeros(ng))
        r += ng
        # stage caps: Σ share·(count) ≤ cap·M
        cap_row = cap_col = cap_group = np.zeros(0, dtype=np.int64)
        share = self._stage_share(dag.group_cost)
        if self.stage_cap is not None and ng:
            stages = sorted({s for s, _ in self.groups})
            sid = {s: i for i, s in enumerate(stages)}
            cap_group = y_gid
            cap_row = r + np.array([sid[self.groups[i][0]] for i in y_gid], dtype=np.int64)
            cap_col = col_y + np.arange(ny, dtype=np.int64)
            rows.append(cap_row)
            cols.append(cap_col)
            vals.append(np.array([share[self.groups[i]] for i in y_gid], dtype=float))
            row_lo.append(np.full(len(stages), -inf))
            row_hi.append(np.full(len(stages), self.stage_cap * dag.n_microbatches))
            r += len(stages)
        # budget: Σ slope·y ≤ ε − Σ loss[0], scaled
        slopes = np.zeros(ny)
        loss0 = 0.0
        for (s, g), i in gid.items():
            curve = np.asarray(self.loss[(s, g)][: kmax + 1], dtype=float)
            slopes[i * kmax : (i + 1) * kmax] = np.diff(curve)
            loss0 += float(curve[0])
        pos = slopes[slopes > 0]
        scale = 1.0 / self.budget if self.budget > 0 else (1.0 / pos.max() if pos.size else 1.0)
        if ng:
            rows.append(np.full(ny, r, dtype=np.int64))
            cols.append(col_y + np.arange(ny, dtype=np.int64))
            vals.append(slopes * scale)
            row_lo.append(np.array([-inf]))
            row_hi.append(np.array([(self.budget - loss0) * scale]))
            r += 1
        nrow = r

        R = np.concatenate(rows)
        C = np.concatenate(cols)
        V = np.concatenate(vals)
        o = np.lexsort((R, C))
        R, C, V = R[o], C[o], V[o]
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = ncol, nrow
        c0 = np.zeros(ncol)
        c0[col_T] = 1.0
        lp.col_cost_ = c0
        lp.col_lower_ = np.zeros(ncol)
        hi = np.full(ncol, inf)
        hi[n:col_T] = 1.0
        hi[col_y:] = 1.0
        lp.col_upper_ = hi
        lp.row_lower_ = np.concatenate(row_lo)
        lp.row_upper_ = np.concatenate(row_hi)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.searchsorted(C, np.arange(ncol + 1)).astype(np.int32)
        lp.a_matrix_.index_ = R.astype(np.int32)
        lp.a_matrix_.value_ = V

        self._arr = _Arrays(
            order=order,
            cost=cost,
            key_act=key_act,
            key_c=key_c,
            src=src,
            dst=dst,
            lag=lag,
            sinks=sinks,
            drop=drop,
            x_row=x_row,
            x_key=x_key,
            cap_row=cap_row,
            cap_col=cap_col,
            cap_group=cap_group,
            n_prec=E,
        )
        self._group_cost = dag.group_cost
        self._rank_actions = dag.rank_actions
        self._edges = {(u, v): float(lg) for u, v, lg in dag.graph.edges(data="lag")}
        self._n, self._K, self._col_T, self._col_y = n, K, col_T, col_y
        self._ncol, self._nrow = ncol, nrow
        self._slopes, self._scale, self._loss0 = slopes * scale, scale, loss0
        h = quiet_highs(self.threads)
        with stdout_to_stderr():
            h.passModel(lp)
        self._h = h
        self._solved = False
        self.info = {
            "actions": n,
            "edges": dag.graph.number_of_edges(),
            "edges_dropped": len(drop),
            "rows": nrow,
            "cols": ncol,
            "nonzeros": len(V),
        }
        self.build_seconds = time.perf_counter() - t0

    def _crash_basis(self) -> Any:
        """Start times basic, each fixed by the edge that sets it in the no-freeze timeline."""
        import highspy

        a = self._arr
        n = self._n
        by_dst = np.argsort(a.dst, kind="stable")
        ptr = np.searchsorted(a.dst[by_dst], np.arange(n + 1))
        src_l, lag_l, cost_l = a.src.tolist(), a.lag.tolist(), a.cost.tolist()
        by_l, ptr_l = by_dst.tolist(), ptr.tolist()
        fin = [0.0] * n
        tight_l = [-1] * n
        for v in range(n):
            best, arg = 0.0, -1
            for j in range(ptr_l[v], ptr_l[v + 1]):
                e = by_l[j]
                r = fin[src_l[e]] + lag_l[e]
                if r > best or (arg < 0 and r == best and r > 0):
                    best, arg = r, e
            fin[v] = best + cost_l[v]
            tight_l[v] = arg
        tight = np.array(tight_l, dtype=np.int64)
        fin_a = np.array(fin)
        last = int(np.argmax(fin_a[a.sinks])) if len(a.sinks) else -1
        basic, lower, upper = (
            highspy.HighsBasisStatus.kBasic,
            highspy.HighsBasisStatus.kLower,
            highspy.HighsBasisStatus.kUpper,
        )
        col = [lower] * self._ncol
        row = [basic] * self._nrow
        for v in np.flatnonzero(tight >= 0).tolist():
            col[v] = basic
            row[int(tight[v])] = upper
        if last >= 0:
            col[self._col_T] = basic
            row[a.n_prec + last] = upper
        b = highspy.HighsBasis()
        b.col_status = col
        b.row_status = row
        return b

    # -- solving -------------------------------------------------------------------------------
    def solve(self, time_limit: float = math.inf, *, phase2: bool = True) -> LpAnswer:
        """Both phases (phase 1 alone without `phase2`); raises SolverError when either does not
        reach optimality."""
        warm = self._solved
        h = self._h
        deadline = time.perf_counter() + time_limit
        t0 = time.perf_counter()
        big = self.method == "ipm" or (self.method == "auto" and self._n >= IPM_FROM)
        ipm = big and (not warm or self._warm_gave_up)
        if ipm:
            h.clearSolver()
        elif not warm:
            h.setBasis(self._crash_basis())
        elif self._basis1 is not None and self._in_phase2:
            h.setBasis(self._basis1)
        # phase 1: minimise T
        ncol = self._ncol
        every = np.arange(ncol, dtype=np.int32)
        if self._in_phase2 or not warm:
            c1 = np.zeros(ncol)
            c1[self._col_T] = 1.0
            h.changeColsCost(ncol, every, c1)
            h.changeColBounds(self._col_T, 0.0, h.getInfinity())
            self._in_phase2 = False
        h.setOptionValue("solver", "ipm" if ipm else "simplex")
        h.setOptionValue("simplex_strategy", 1)
        if warm and big and not ipm:
            # On a DAG this size each pivot is dear: the last basis gets WARM_PIVOTS pivots per
            # action, then the model is solved cold by interior point (a count, not a clock, so
            # the answer does not depend on the machine's load).
            budget = max(WARM_MIN_PIVOTS, int(WARM_PIVOTS * self._n))
            h.setOptionValue("simplex_iteration_limit", budget)
            try:
                it1 = self._run(deadline, phase=1, may_stop=True)
            finally:
                h.setOptionValue("simplex_iteration_limit", 2**31 - 1)
            if it1 < 0:
                self._warm_gave_up = True
                h.clearSolver()
                h.setOptionValue("solver", "ipm")
                ipm = True
                it1 = self._run(deadline, phase=1)
        else:
            it1 = self._run(deadline, phase=1)
        h.setOptionValue("solver", "simplex")
        col = np.asarray(h.getSolution().col_value)
        t1 = float(col[self._col_T])
        # phase 2: minimise signal with T bounded; phase 1's basis stays primal feasible
        it2 = 0
        if self._K and phase2:
            self._basis1 = h.getBasis()
            c2 = np.zeros(ncol)
            c2[self._col_y :] = self._slopes
            h.changeColsCost(ncol, every, c2)
            h.changeColBounds(self._col_T, 0.0, phase2_limit(t1, self.tolerance))
            h.setOptionValue("simplex_strategy", 4)
            self._in_phase2 = True
            it2 = self._run(deadline, phase=2)
            col = np.asarray(h.getSolution().col_value)
        xv = np.clip(col[self._n : self._n + self._K], 0.0, 1.0)
        signal = self._loss0 + (
            float(col[self._col_y :] @ self._slopes) / self._scale if self._K else 0.0
        )
        self._solved = True
        solver_s = time.perf_counter() - t0
        return LpAnswer(
            t1=t1,
            keys=self.keys,
            values=xv,
            signal=signal,
            iterations=(it1, it2),
            build_seconds=0.0 if warm else self.build_seconds,
            solver_seconds=solver_s,
            warm=warm,
            method="ipm" if ipm else "simplex",
        )

    def fix(self, ones: Sequence[int] = (), zeros: Sequence[int] = ()) -> None:
        """Fix keys (positions in `keys`) at frozen (`ones`) or not frozen (`zeros`) for the
        solves that follow, which start from the last basis: what LP diving does
        (`freezeopt.solver.dive`). Bounds never break an edge reduction (durations stay ≥ `d_min`)."""
        h = self._h
        for chosen, v in ((ones, 1.0), (zeros, 0.0)):
            if len(chosen):
                cols = self._n + np.asarray(chosen, dtype=np.int32)
                val = np.full(len(cols), v)
                h.changeColsBounds(len(cols), cols, val, val)

    def _run(self, deadline: float, *, phase: int, may_stop: bool = False) -> int:
        """Run HiGHS; return the simplex pivots it made (−1: stopped on its pivot limit, when
        `may_stop`). Raises SolverError when it does not reach optimality."""
        import highspy

        h = self._h
        left = deadline - time.perf_counter()
        if left <= 0:
            raise LpUnsolved(
                f"the LP relaxation did not solve (time_limit in phase {phase}); raise --time-limit"
            )
        # HiGHS compares time_limit with its run time summed over every run of this model
        h.setOptionValue("time_limit", float(min(h.getRunTime() + left, 1e30)))
        before = h.getInfo().simplex_iteration_count
        with stdout_to_stderr():
            h.run()
        status = h.getModelStatus()
        if may_stop and status == highspy.HighsModelStatus.kIterationLimit:
            return -1
        if status != highspy.HighsModelStatus.kOptimal:
            what = h.modelStatusToString(status)
            hint = (
                "raise --time-limit"
                if status == highspy.HighsModelStatus.kTimeLimit
                else "try --solver cbc"
            )
            self._solved = False
            raise LpUnsolved(f"the LP relaxation did not solve ({what} in phase {phase}); {hint}")
        return max(0, h.getInfo().simplex_iteration_count - max(before, 0))

    # -- warm re-solve ---------------------------------------------------------------------------
    def resolve(self, dag: PipelineDag, time_limit: float = math.inf) -> LpAnswer:
        """Solve again for `dag` — the same schedule with new action, group or lag costs — from the
        last basis. Raises InputError when `dag` is another schedule."""
        a = self._arr
        if dag.order != a.order or dag.rank_actions != self._rank_actions:
            raise InputError(
                "resolve needs the same schedule (actions and ranks); build a new FastLP"
            )
        edges = {(u, v): float(lg) for u, v, lg in dag.graph.edges(data="lag")}
        if edges.keys() != self._edges.keys():
            raise InputError("resolve needs the same DAG edges; build a new FastLP")
        new_keys = [
            (act, g)
            for act in dag.freezable()
            for g, c in enumerate(dag.group_cost[act.stage])
            if c > 0 and self.kmax > 0
        ]
        if new_keys != self.keys:
            raise InputError(
                "resolve needs the same freezable groups (a group's cost became zero or positive); "
                "build a new FastLP"
            )
        t0 = time.perf_counter()
        cost = np.array([dag.cost[x] for x in a.order], dtype=float)
        key_c = np.array([dag.group_cost[x.stage][g] for x, g in self.keys], dtype=float)
        dmin = cost - np.bincount(a.key_act, weights=key_c, minlength=self._n)
        order_idx = {x: i for i, x in enumerate(a.order)}
        lag = np.array(
            [
                edges[(a.order[u], a.order[v])]
                for u, v in zip(a.src.tolist(), a.dst.tolist(), strict=True)
            ],
            dtype=float,
        )
        if not self._reductions_hold(dag, order_idx, dmin, edges):
            self._build(dag)
            return self.solve(time_limit)
        h = self._h
        # right-hand sides of precedence and sink rows
        hi = np.concatenate([-(cost[a.src] + lag), -cost[a.sinks]])
        changed_rows = np.flatnonzero(
            hi != np.concatenate([-(a.cost[a.src] + a.lag), -a.cost[a.sinks]])
        ).astype(np.int32)
        if changed_rows.size:
            h.changeRowsBounds(
                int(changed_rows.size),
                changed_rows,
                np.full(changed_rows.size, -h.getInfinity()),
                hi[changed_rows],
            )
        # x coefficients in precedence and sink rows
        ck = np.flatnonzero(key_c != a.key_c)
        if ck.size:
            hit = np.isin(a.x_key, ck)
            for row, key in zip(a.x_row[hit].tolist(), a.x_key[hit].tolist(), strict=True):
                h.changeCoeff(int(row), int(self._n + key), float(-key_c[key]))
        # stage-cap coefficients (each group's share of its stage's freezable time)
        if a.cap_row.size:
            share_old = self._stage_share(self._group_cost)
            share_new = self._stage_share(dag.group_cost)
            moved = [i for i, sg in enumerate(self.groups) if share_new[sg] != share_old[sg]]
            if moved:
                hit = np.isin(a.cap_group, moved)
                for row, colj, gi in zip(
                    a.cap_row[hit].tolist(),
                    a.cap_col[hit].tolist(),
                    a.cap_group[hit].tolist(),
                    strict=True,
                ):
                    h.changeCoeff(int(row), int(colj), float(share_new[self.groups[gi]]))
        a.cost, a.key_c, a.lag = cost, key_c, lag
        self._group_cost = dag.group_cost
        self._edges = edges
        update_s = time.perf_counter() - t0
        ans = self.solve(time_limit)
        return LpAnswer(
            t1=ans.t1,
            keys=ans.keys,
            values=ans.values,
            signal=ans.signal,
            iterations=ans.iterations,
            build_seconds=update_s,
            solver_seconds=ans.solver_seconds,
            warm=ans.warm,
            method=ans.method,
        )

    def _reductions_hold(
        self,
        dag: PipelineDag,
        idx: Mapping[Action, int],
        dmin: np.ndarray,
        edges: Mapping[tuple[Action, Action], float],
    ) -> bool:
        """Whether every left-out edge is still implied under new costs and lags."""
        drop = self._arr.drop
        if not len(drop):
            return True
        order = self._arr.order
        rank, pos, pre = rank_prefix(dag, idx, dmin)
        u, w, v = drop[:, 0], drop[:, 1], drop[:, 2]
        between = _chain(pre, rank, pos, u, w)
        lag_u = np.array(
            [edges[(order[i], order[j])] for i, j in zip(u.tolist(), v.tolist(), strict=True)]
        )
        lag_w = np.array(
            [edges[(order[i], order[j])] for i, j in zip(w.tolist(), v.tolist(), strict=True)]
        )
        return bool(np.all(lag_u <= lag_w + between))


class LpCache:
    """The last `FastLP` of a sequence of solves of one schedule, re-solved warm when it can be.

    A solve is warm when the schedule, the freezable groups, their signal curves and the options
    are those of the last one (only action, group or lag costs changed, as in a re-plan from
    measured costs); otherwise the model is built again and solved cold. Not thread-safe: one
    solve at a time."""

    def __init__(self) -> None:
        self._fast: FastLP | None = None
        self._key: tuple[Any, ...] | None = None
        self.solves = 0
        self.warm_solves = 0
        """Solves answered from the last basis (not counting warm attempts that gave up)."""

    def solve(self, problem: FreezeProblem, time_limit: float = math.inf) -> tuple[LpAnswer, float]:
        """Both phases for a problem; returns the answer and the
        seconds spent building or updating the problem. Raises SolverError as `FastLP.solve` does
        (the next solve is then cold)."""
        o = problem.opts
        key = (
            tuple(problem.keys),
            tuple(sorted((sg, tuple(c)) for sg, c in problem.loss.items())),
            problem.kmax,
            o.budget,
            o.stage_cap,
            o.tolerance,
            o.threads,
        )
        self.solves += 1
        fast, self._fast = self._fast, None  # dropped if this solve fails
        ans: LpAnswer | None = None
        try:
            if fast is not None and key == self._key:
                # InputError: another schedule or other freezable groups; build anew
                with contextlib.suppress(InputError):
                    ans = fast.resolve(problem.dag, time_limit=time_limit)
            if ans is None:
                fast = FastLP.for_problem(problem)
                ans = fast.solve(time_limit=time_limit)
        except SolverError:
            self._key = None
            raise
        self._fast, self._key = fast, key
        self.warm_solves += ans.warm and ans.method == "simplex"  # not a fallback to cold ipm
        return ans, ans.build_seconds

    def take(self) -> FastLP | None:
        """Hand over the last model, solved, and forget it: the caller may change it (the LP dive
        fixes keys in it); the next solve builds anew."""
        fast, self._fast, self._key = self._fast, None, None
        return fast


def _chain(
    pre: list[np.ndarray], rank: np.ndarray, pos: np.ndarray, u: np.ndarray, w: np.ndarray
) -> np.ndarray:
    """Σ d_min over the actions after u up to and including w, on their shared rank."""
    return np.array(
        [
            pre[r][pw + 1] - pre[r][pu + 1]
            for r, pu, pw in zip(rank[u].tolist(), pos[u].tolist(), pos[w].tolist(), strict=True)
        ],
        dtype=float,
    )


def _reduced_edges(
    dag: PipelineDag, idx: Mapping[Action, int], dmin: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The edges the LP needs (src, dst, lag) and the left-out ones as (u, w, v) rows.

    Edge u → v is left out when another in-edge w → v has w after u on u's rank and
    lag(u,v) ≤ lag(w,v) + Σ d_min(u < z ≤ w): program order then carries it. Program-order edges
    are never left out, so every implication ends in a kept edge."""
    rank, pos, pre = rank_prefix(dag, idx, dmin)
    rank_l, pos_l = rank.tolist(), pos.tolist()
    pre_l = [p.tolist() for p in pre]
    src: list[int] = []
    dst: list[int] = []
    lag: list[float] = []
    drop: list[tuple[int, int, int]] = []
    pred = dag.graph.pred
    for v in dag.order:
        j = idx[v]
        ins = [(idx[u], float(at["lag"])) for u, at in pred[v].items()]
        for u, lu in ins:
            ru, pu = rank_l[u], pos_l[u]
            by = -1
            if len(ins) > 1:
                p = pre_l[ru]
                for w, lw in ins:
                    if (
                        w != u
                        and rank_l[w] == ru
                        and pos_l[w] > pu
                        and lu <= lw + (p[pos_l[w] + 1] - p[pu + 1])
                    ):
                        by = w
                        break
            if by >= 0:
                drop.append((u, by, j))
            else:
                src.append(u)
                dst.append(j)
                lag.append(lu)
    return (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(lag, dtype=float),
        np.array(drop, dtype=np.int64).reshape(-1, 3),
    )
