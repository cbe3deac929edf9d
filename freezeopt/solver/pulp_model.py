"""The freezing problem posed in PuLP: named variables and rows, both phases, warm starts.

Variables: a start time `t_v` per action, a makespan `T`, and `x[v,g] ∈ {0,1}` ("group g is frozen
in action v") for every freezable key. An action lasts `D_v − Σ_g c[s,g]·x[v,g]`, with `c` the
measured weight-gradient cost of group g of stage s. Precedence along every DAG edge
(`prec_{u}_{v}`): `t_u + d_u + lag(u,v) ≤ t_v`; `T ≥ t_v + d_v` for the last actions (`end_{u}`).
Per (stage, group), the count `count_s{s}_g{g} = Σ_m x[(s,m),g]` is at most
`floor(group_cap·M)` (`groupcap_s{s}_g{g}`), and the group loses `loss_sg(k)` of the step's
expected progress; `loss_sg` is convex, so `signal_s{s}_g{g} ≥` each of its linear pieces
(`piece_s{s}_g{g}_k{j}`) carries it exactly. The budget (`budget`): `Σ signal ≤ ε`. An optional
per-stage cap (`stagecap_s{s}`) bounds the mean freeze ratio over a stage's backwards. Backward
truncation, where the profile measured it: continuous `trunc_{a}_j{j}` chained down each
microbatch's stages (`_truncation`), each saving its measured gain where every group before it is
frozen.

The objective is lexicographic, in two solves rather than a big-M constant: phase 1 minimises `T`;
phase 2 minimises the signal dropped subject to `T ≤ (1 + tolerance)·T1` (`makespan_limit`).
Sparse throughout: one row per DAG edge, and the per-group count is its own variable, so the
pieces hold two nonzeros each rather than every microbatch's `x`. With HiGHS, phase 2 re-solves
phase 1's model in place (new objective, `T` bounded) from its basis or incumbent (a MIP in a
child process, `freezeopt.solver.highs_child`); CBC solves phase 2 from a fresh model,
MIP-started from phase 1's answer.

Why its own module: this is the model people read (`--write-model`) and the reference the array
path (`freezeopt.solver.lp_arrays`) is tested against; how the time limit is shared between it
and the other strategies is `freezeopt.solver.modes`'s business.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pulp

from freezeopt.actions import Action
from freezeopt.errors import LpUnsolved
from freezeopt.fileio import stdout_to_stderr
from freezeopt.model.simulate import simulate
from freezeopt.solver.highs_child import solve_mip_until
from freezeopt.solver.lp_arrays import phase2_limit
from freezeopt.solver.problem import FreezeProblem, Key, SolverName, Spent, pwl
from freezeopt.solver.pulp_run import highs_status, run_pulp, write_pulp_model
from freezeopt.solver.time_limits import IPM_FROM, more_time, seconds_left

__all__ = ["PulpModel"]


@dataclass(slots=True)
class _Vars:
    """The PuLP variables of one built model."""

    x: dict[Key, pulp.LpVariable]
    T: pulp.LpVariable
    ell: list[pulp.LpVariable]


class PulpModel:
    """Builds and solves the PuLP models of one problem (both phases; LP or MILP).

    Seconds go to `spent` (`build` for the models, `solver` inside the solvers)."""

    def __init__(self, problem: FreezeProblem, spent: Spent):
        self.problem, self.spent = problem, spent
        self.wrote_model = False
        """Whether `--write-model` wrote a model: not where no PuLP model was built for the answer
        (no LP, or no time for the MILP)."""
        self.relax_seconds = 0.0
        """Seconds phase 1 of the LP relaxation took through PuLP (model and solver; 0 when the
        LP went as arrays), about what CBC spends on a MILP's root LP before it checks its time
        limit."""

    def build(self, *, integer: bool, t_max: float | None) -> tuple[pulp.LpProblem, _Vars]:
        t0 = time.perf_counter()
        try:
            return self._build(integer=integer, t_max=t_max)
        finally:
            self.spent.build += time.perf_counter() - t0

    def _build(self, *, integer: bool, t_max: float | None) -> tuple[pulp.LpProblem, _Vars]:
        dag, opts = self.problem.dag, self.problem.opts
        prob = pulp.LpProblem(
            "freezeopt_phase2" if t_max is not None else "freezeopt_phase1", pulp.LpMinimize
        )
        t = {a: prob.add_variable(f"t_{a}", 0) for a in dag.order}
        cat = pulp.LpBinary if integer else pulp.LpContinuous
        x = {(a, g): prob.add_variable(f"x_{a}_g{g}", 0, 1, cat) for a, g in self.problem.keys}
        T = prob.add_variable("makespan", 0)
        xs_of: dict[Action, list[tuple[pulp.LpVariable, float]]] = {}
        for (a, g), var in x.items():
            xs_of.setdefault(a, []).append((var, -dag.group_cost[a.stage][g]))
        chain = self._truncation(prob, x)
        for a, terms in chain.items():
            xs_of.setdefault(a, []).extend(terms)

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
        for (s, g), keys in sorted(self.problem.by_group.items()):
            k = prob.add_variable(f"count_s{s}_g{g}", 0)
            e = pulp.LpAffineExpression([*((x[kk], 1.0) for kk in keys), (k, -1.0)])
            prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintEQ, f"count_s{s}_g{g}", 0.0))
            le([(k, 1.0)], float(self.problem.kmax), f"groupcap_s{s}_g{g}")
            sig = prob.add_variable(f"signal_s{s}_g{g}", 0)
            ell.append(sig)
            loss, last_slope = self.problem.loss[(s, g)], None
            for j in range(self.problem.kmax):
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
                    (x[kk], self.problem.stage_share[(s, kk[1])])
                    for kk in self.problem.keys
                    if kk[0].stage == s
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

    def _truncation(
        self, prob: pulp.LpProblem, x: Mapping[Key, pulp.LpVariable]
    ) -> dict[Action, list[tuple[pulp.LpVariable, float]]]:
        """Backward truncation (`PipelineDag.truncation_saving`) as rows: per truncated action a
        of stage s, y_j ∈ [0, 1] "a's backward stops above group j" with `trunc_{a}_j{j}`:
        y_0 ≤ the stage before's last y where it passes (`truncfrom_{a}`; 1 on stage 0, no y_0
        otherwise), y_j ≤ y_j−1 (`truncchain_{a}_j{j}`) and y_j ≤ x[a, j−1]
        (`truncfrozen_{a}_j{j}`); a saves Σ_j gain_j·y_j. Returns a's duration terms."""
        dag = self.problem.dag
        if not dag.has_truncation:
            return {}
        acts = dag.truncated()
        out: dict[Action, list[tuple[pulp.LpVariable, float]]] = {}

        def le(a: pulp.LpVariable, b: pulp.LpVariable, name: str) -> None:
            e = pulp.LpAffineExpression([(a, 1.0), (b, -1.0)])
            prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintLE, name, 0.0))

        for m in range(dag.n_microbatches):
            up: pulp.LpVariable | None = None  # the stage before's y, frozen whole
            for s in range(dag.n_stages):
                a = acts.get(s, {}).get(m)
                if a is None:  # not truncated here: the stages after need its gradient anyway
                    break
                gains = dag.truncation[s]
                y = prob.add_variable(f"trunc_{a}_j0", 0, 1)
                if s > 0:
                    assert up is not None
                    le(y, up, f"truncfrom_{a}")
                terms = [(y, -gains[0])] if gains[0] > 0 else []
                last: pulp.LpVariable | None = y
                for j in range(1, len(gains)):
                    xv = x.get((a, j - 1))
                    if xv is None:  # a group that cannot be frozen: the backward goes through it
                        last = None
                        break
                    yj = prob.add_variable(f"trunc_{a}_j{j}", 0, 1)
                    le(yj, last, f"truncchain_{a}_j{j}")
                    le(yj, xv, f"truncfrozen_{a}_j{j}")
                    if gains[j] > 0:
                        terms.append((yj, -gains[j]))
                    last = yj
                if terms:
                    out[a] = terms
                up = last if dag.passes[s] else None
                if up is None:
                    break
        return out

    def write(self, prob: pulp.LpProblem, path: Path | None, *, phase: int) -> None:
        """`--write-model`: write a phase's PuLP model (phase 2 beside phase 1's file)."""
        if path is not None:
            write_pulp_model(prob, path, phase=phase)
            self.wrote_model = True

    def t_limit(self, t1: float) -> float:
        """Phase-2 bound on the makespan: the phase-1 value, the tolerance, and numerical slack."""
        return phase2_limit(t1, self.problem.opts.tolerance)

    # -- solving ----------------------------------------------------------------------------
    def _timed(self, fn: Callable[[], str]) -> str:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.spent.solver += time.perf_counter() - t0

    def phases(
        self,
        *,
        integer: bool,
        start: Mapping[Key, float] | None,
        deadline: float,
        write: Path | None,
    ) -> tuple[str, str, dict[Key, float], float]:
        """Run phase 1 then phase 2; return (status1, status2, plan, T1). Where phase 1 finds
        nothing, phase 2 is `skipped`, the plan is `start` (or empty) and T1 is inf."""
        o = self.problem.opts
        began = time.perf_counter()
        p1, v1 = self.build(integer=integer, t_max=None)
        self.write(p1, write, phase=1)
        if start is not None:
            self.warm(p1, v1, start)
        limit1 = seconds_left(deadline) / 2 if integer else seconds_left(deadline)
        # Large LPs here are very degenerate: interior point (with crossover, so phase 2 can start
        # from a basis) beats simplex by 3x and more from a few thousand actions up.
        ipm = not integer and len(self.problem.dag.order) >= IPM_FROM
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
            t1 = self.problem.makespan(plan1)  # the incumbent's true makespan
        else:
            t1 = float(v1.T.value())
        t_max = self.t_limit(t1)
        if write is not None:
            self.write(self.build(integer=integer, t_max=t_max)[0], write, phase=2)
        if o.solver == "highs":
            st2, plan2 = self._timed_highs_phase2(p1, v1, t_max, deadline)
        else:
            p2, v2 = self.build(integer=integer, t_max=t_max)
            if integer:
                self.warm(p2, v2, plan1)
            st2 = self._timed(
                lambda: run_pulp(
                    p2, o, time_limit=seconds_left(deadline), warm=integer, barrier=ipm
                )
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
        a MIP in a child process, `freezeopt.solver.highs_child`)."""
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
                # MIP: in a child process stopped at the deadline (`freezeopt.solver.highs_child`),
                # from phase 1's incumbent
                o = self.problem.opts
                said, x = solve_mip_until(h, values, deadline, gap=o.gap, threads=o.threads)
                if x is None:
                    return ("infeasible" if said == "Infeasible" else said), {}
                status = "optimal" if said == "Optimal" else "time_limit"
                return status, {k: _clip(x[v.index]) for k, v in v1.x.items()}
            # for an LP, HiGHS compares time_limit with its run time summed over every run of
            # this model, phase 1's included
            limit = max(0.5, seconds_left(deadline)) + h.getRunTime()
            h.setOptionValue("solver", "simplex")  # re-use phase 1's basis
            h.setOptionValue("time_limit", limit)
            with stdout_to_stderr():
                h.run()
            status = highs_status(h)
            col = list(h.getSolution().col_value)
            return status, {k: _clip(col[v.index]) for k, v in v1.x.items()}
        finally:
            self.spent.solver += time.perf_counter() - t0

    def solve_lp(self, deadline: float, *, write: Path | None) -> tuple[float, dict[Key, float]]:
        """Both LP phases through the PuLP models, with either solver; returns (phase-1 T, phase-2 x)."""
        st1, st2, plan, t1 = self.phases(integer=False, start=None, deadline=deadline, write=write)
        if st1 != "optimal" or st2 != "optimal":
            st = st1 if st1 != "optimal" else st2
            if "time" in st or st == "no_solution":
                hint = more_time(self.problem.opts.solver)
            else:
                hint = f"try --solver {_other(self.problem.opts.solver)}"
            raise LpUnsolved(f"the LP relaxation did not solve ({st}); {hint}")
        return t1, plan

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
        st1, st2, plan, _ = self.phases(integer=True, start=start, deadline=deadline, write=write)
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
        if self.problem.makespan(best) > self.problem.makespan(start) + 1e-9:
            notes.append(
                "the solver returned a plan slower than its warm start; kept the warm start"
            )
            return start, status, notes
        return best, status, notes

    def no_time_for_milp(self, deadline: float) -> str | None:
        """Why the MILP cannot start before `deadline`, or None when it can."""
        left = seconds_left(deadline)
        if (
            self.problem.opts.solver == "cbc"
            and self.relax_seconds >= 1.0
            and left < self.relax_seconds
        ):
            # measured: 1F1B 16×64 with 8 groups, 1.3 s left, the MILP took 19.7 s
            return (
                f"no time left for the MILP: CBC re-solves the LP relaxation "
                f"({self.relax_seconds:.1f} s) before it checks its time limit, and {left:.1f} s "
                f"were left (--solver highs solves the relaxation much faster)"
            )
        return "no time left for the MILP" if left < 1.0 else None

    def warm(self, prob: pulp.LpProblem, v: _Vars, plan: Mapping[Key, float]) -> None:
        """Set every variable's initial value from a feasible plan (its simulated timeline)."""
        tl = simulate(self.problem.dag, self.problem.dag.durations(plan))
        byname = prob.variablesDict()
        for a, s in tl.start.items():
            byname[f"t_{a}"].setInitialValue(s)
        for k, var in v.x.items():
            var.setInitialValue(round(plan.get(k, 0.0)))
        v.T.setInitialValue(tl.makespan)
        counts = self.problem.counts(plan)
        for s, g in self.problem.by_group:
            n = counts.get((s, g), 0.0)
            byname[f"count_s{s}_g{g}"].setInitialValue(n)
            byname[f"signal_s{s}_g{g}"].setInitialValue(pwl(self.problem.loss[(s, g)], n))


def _clip(v: float | None) -> float:
    return 0.0 if v is None else min(1.0, max(0.0, float(v)))


def _other(s: SolverName) -> SolverName:
    return "highs" if s == "cbc" else "cbc"
