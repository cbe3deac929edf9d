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

Modes: `milp` (binary x, time-limited, warm-started from the heuristic), `lp` (x ∈ [0,1], the
continuous relaxation; with one group per stage, `flat` sensitivity, no budget and a per-stage cap
it is TimelyFreeze's LP), and `heuristic` (round the LP's phase-2 solution down per group, then
greedily freeze more on the critical path while the budget allows). Every mode reports the
no-freeze step time, the all-frozen floor, the LP bound and the step time the list-scheduling
simulator gives for the answer.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pulp

from freezeopt.actions import Action
from freezeopt.dag import PipelineDag
from freezeopt.errors import InputError, SolverError
from freezeopt.fileio import stdout_to_stderr
from freezeopt.sensitivity import Estimator, GroupSignal
from freezeopt.simulate import simulate

__all__ = ["MODES", "SOLVERS", "Mode", "SolveOptions", "SolveResult", "SolverName", "solve"]

Mode = Literal["milp", "lp", "heuristic"]
SolverName = Literal["cbc", "highs"]
MODES: tuple[Mode, ...] = ("milp", "lp", "heuristic")
SOLVERS: tuple[SolverName, ...] = ("cbc", "highs")
Key = tuple[Action, int]


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
    """Seconds for the MILP, both phases together."""
    gap: float = 0.005
    """Relative MILP gap at which the solver may stop."""
    threads: int = 1
    write_model: Path | None = None
    """Write the phase-1 model here (`.lp` or `.mps`) and phase 2 beside it (`NAME.phase2.lp`)."""


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
    """Phase-1 optimum of the LP relaxation under the same budget and caps: no plan beats it."""
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
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent building PuLP models (`build`), in the solver (`solver`) and in the rest (`other`)."""


def solve(
    dag: PipelineDag, signal: tuple[tuple[GroupSignal, ...], ...], opts: SolveOptions
) -> SolveResult:
    """Decide what to freeze in `dag` under `opts`; see the module docstring."""
    _check_options(dag, signal, opts)
    t0 = time.perf_counter()
    baseline = simulate(dag).makespan
    floor = simulate(dag, dag.durations(dag.all_frozen())).makespan
    model = _Model(dag, signal, opts)
    notes: list[str] = []

    lp1, lp_x, lp_status = model.solve_lp(write=opts.write_model if opts.mode != "milp" else None)
    if opts.mode == "lp":
        frozen, status = lp_x, lp_status
    else:
        frozen = _round_and_fill(dag, model, lp_x)
        status = "heuristic"
        if opts.mode == "milp":
            frozen, status, milp_notes = model.solve_milp(frozen, write=opts.write_model)
            notes.extend(milp_notes)
    predicted = simulate(dag, dag.durations(frozen)).makespan
    lp_bound = min(lp1, predicted)
    return SolveResult(
        status=status,
        mode=opts.mode,
        solver=opts.solver,
        baseline_ms=baseline,
        all_frozen_ms=floor,
        lp_bound_ms=lp_bound,
        predicted_ms=predicted,
        gap=(predicted - lp_bound) / predicted if predicted > 0 else 0.0,
        signal_dropped=model.signal_of(frozen),
        solve_seconds=time.perf_counter() - t0,
        frozen={k: v for k, v in sorted(frozen.items()) if v > 1e-9},
        budget=opts.budget,
        notes=tuple(notes),
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
        raise InputError(f"--time-limit must be positive (got {o.time_limit})")
    if not (0 <= o.gap < 1):
        raise InputError(f"--gap must be in [0, 1) (got {o.gap})")
    if o.mode not in MODES:
        raise InputError(f"unknown mode {o.mode!r}; use one of {', '.join(MODES)}")
    if o.solver not in SOLVERS:
        raise InputError(f"unknown solver {o.solver!r}; use one of {', '.join(SOLVERS)}")
    if [len(r) for r in signal] != [len(r) for r in dag.group_names]:
        raise InputError("sensitivities do not match the profile's groups")


class _Model:
    """Builds and solves the PuLP models for one DAG and option set (sparse: one row per edge)."""

    def __init__(
        self, dag: PipelineDag, signal: tuple[tuple[GroupSignal, ...], ...], opts: SolveOptions
    ):
        self.dag, self.opts = dag, opts
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
        self.by_group: dict[tuple[int, int], list[Key]] = {}
        for k in self.keys:
            self.by_group.setdefault((k[0].stage, k[1]), []).append(k)

    # -- evaluation -------------------------------------------------------------------------
    def signal_of(self, frozen: Mapping[Key, float]) -> float:
        """Signal dropped by a plan (piecewise-linear in the count for fractional plans)."""
        counts: dict[tuple[int, int], float] = {}
        for (a, g), x in frozen.items():
            counts[(a.stage, g)] = counts.get((a.stage, g), 0.0) + x
        return sum(_pwl(self.loss[sg], k) for sg, k in counts.items())

    def fits(self, frozen: Mapping[Key, float]) -> bool:
        """Budget, group caps and stage caps all hold (with a small tolerance)."""
        counts: dict[tuple[int, int], float] = {}
        for (a, g), x in frozen.items():
            counts[(a.stage, g)] = counts.get((a.stage, g), 0.0) + x
        if any(k > self.kmax + 1e-6 for k in counts.values()):
            return False
        if self.opts.stage_cap is not None:
            for _s, used in self._stage_ratio(frozen).items():
                if used > self.opts.stage_cap * self.dag.n_microbatches + 1e-6:
                    return False
        return self.signal_of(frozen) <= self.opts.budget + 1e-9

    def _stage_ratio(self, frozen: Mapping[Key, float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for (a, g), x in frozen.items():
            cs = self.dag.group_cost[a.stage]
            out[a.stage] = out.get(a.stage, 0.0) + x * cs[g] / sum(cs)
        return out

    # -- model building ---------------------------------------------------------------------
    def build(
        self, *, integer: bool, t_max: float | None
    ) -> tuple[pulp.LpProblem, dict[Key, pulp.LpVariable], pulp.LpVariable]:
        t0 = time.perf_counter()
        try:
            return self._build(integer=integer, t_max=t_max)
        finally:
            self.build_seconds += time.perf_counter() - t0

    def _build(
        self, *, integer: bool, t_max: float | None
    ) -> tuple[pulp.LpProblem, dict[Key, pulp.LpVariable], pulp.LpVariable]:
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
        graph = dag.graph
        for u in dag.order:
            dur = dag.cost[u]
            terms = xs_of.get(u, [])
            succ = graph.succ[u]
            for v, attrs in succ.items():
                e = pulp.LpAffineExpression(
                    [(t[u], 1.0), (t[v], -1.0), *terms], constant=dur + attrs["lag"]
                )
                prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintLE, f"prec_{u}_{v}", 0.0))
            if not succ:
                e = pulp.LpAffineExpression([(t[u], 1.0), (T, -1.0), *terms], constant=dur)
                prob.addConstraint(pulp.LpConstraint(e, pulp.LpConstraintLE, f"end_{u}", 0.0))
        ell_terms = []
        for (s, g), keys in sorted(self.by_group.items()):
            count = [(x[k], 1.0) for k in keys]
            prob.addConstraint(
                pulp.LpConstraint(
                    pulp.LpAffineExpression(count),
                    pulp.LpConstraintLE,
                    f"groupcap_s{s}_g{g}",
                    float(self.kmax),
                )
            )
            ell = prob.add_variable(f"signal_s{s}_g{g}", 0)
            ell_terms.append((ell, 1.0))
            loss = self.loss[(s, g)]
            last_slope = None
            for j in range(self.kmax):
                slope = loss[j + 1] - loss[j]
                if last_slope is not None and abs(slope - last_slope) <= 1e-12 * max(
                    1.0, abs(slope)
                ):
                    continue  # same line as the previous piece
                last_slope = slope
                # ell ≥ loss[j] + slope·(k − j)
                e = pulp.LpAffineExpression(
                    [(ell, -1.0), *((v, slope) for v, _ in count)], constant=loss[j] - slope * j
                )
                prob.addConstraint(
                    pulp.LpConstraint(e, pulp.LpConstraintLE, f"piece_s{s}_g{g}_k{j}", 0.0)
                )
        if opts.stage_cap is not None:
            for s in range(dag.n_stages):
                cs = dag.group_cost[s]
                terms2 = [(x[k], cs[k[1]] / sum(cs)) for k in self.keys if k[0].stage == s]
                if terms2:
                    prob.addConstraint(
                        pulp.LpConstraint(
                            pulp.LpAffineExpression(terms2),
                            pulp.LpConstraintLE,
                            f"stagecap_s{s}",
                            opts.stage_cap * dag.n_microbatches,
                        )
                    )
        if ell_terms:
            prob.addConstraint(
                pulp.LpConstraint(
                    pulp.LpAffineExpression(ell_terms), pulp.LpConstraintLE, "budget", opts.budget
                )
            )
        if t_max is None:
            prob.setObjective(pulp.LpAffineExpression([(T, 1.0)]))
        else:
            prob.addConstraint(
                pulp.LpConstraint(
                    pulp.LpAffineExpression([(T, 1.0)]),
                    pulp.LpConstraintLE,
                    "makespan_limit",
                    t_max,
                )
            )
            prob.setObjective(
                pulp.LpAffineExpression(ell_terms)
                if ell_terms
                else pulp.LpAffineExpression([(T, 0.0)])
            )
        return prob, x, T

    def t_limit(self, t1: float) -> float:
        """Phase-2 bound on the makespan: the phase-1 value, the tolerance, and numerical slack."""
        return t1 * (1 + self.opts.tolerance) + 1e-7 * t1 + 1e-6

    # -- solving ----------------------------------------------------------------------------
    def run(self, prob: pulp.LpProblem, *, time_limit: float | None, warm: bool) -> str:
        t0 = time.perf_counter()
        try:
            return _run(prob, self.opts, time_limit=time_limit, warm=warm)
        finally:
            self.solver_seconds += time.perf_counter() - t0

    def solve_lp(self, *, write: Path | None) -> tuple[float, dict[Key, float], str]:
        """Both phases of the LP relaxation; returns (phase-1 T, phase-2 x, status)."""
        p1, _, T = self.build(integer=False, t_max=None)
        _write(p1, write, phase=1)
        st = self.run(p1, time_limit=None, warm=False)
        if st != "optimal":
            raise SolverError(
                f"the LP relaxation did not solve ({st}); try --solver {_other(self.opts.solver)}"
            )
        t1 = float(T.value())
        p2, x, _ = self.build(integer=False, t_max=self.t_limit(t1))
        _write(p2, write, phase=2)
        st = self.run(p2, time_limit=None, warm=False)
        if st != "optimal":
            raise SolverError(
                f"phase 2 of the LP did not solve ({st}); try --solver {_other(self.opts.solver)}"
            )
        return t1, {k: _clip(v.value()) for k, v in x.items()}, "optimal"

    def solve_milp(
        self, start: dict[Key, float], *, write: Path | None
    ) -> tuple[dict[Key, float], str, list[str]]:
        """Both MILP phases, warm-started from `start`; falls back to `start` if the solver finds nothing."""
        notes: list[str] = []
        deadline = time.perf_counter() + self.opts.time_limit
        p1, x1, T1 = self.build(integer=True, t_max=None)
        _write(p1, write, phase=1)
        self._warm(p1, x1, T1, start)
        st1 = self.run(p1, time_limit=self.opts.time_limit / 2, warm=True)
        if st1 not in ("optimal", "time_limit"):
            notes.append(f"MILP phase 1 found no solution ({st1}); kept the heuristic answer")
            return start, "heuristic_fallback", notes
        plan1 = {k: round(_clip(v.value())) * 1.0 for k, v in x1.items()}
        t1 = simulate(self.dag, self.dag.durations(plan1)).makespan
        p2, x2, T2 = self.build(integer=True, t_max=self.t_limit(t1))
        _write(p2, write, phase=2)
        self._warm(p2, x2, T2, plan1)
        left = max(1.0, deadline - time.perf_counter())
        st2 = self.run(p2, time_limit=left, warm=True)
        if st2 not in ("optimal", "time_limit"):
            notes.append(f"MILP phase 2 found no solution ({st2}); kept phase 1's answer")
            return plan1, "time_limit", notes
        plan2 = {k: round(_clip(v.value())) * 1.0 for k, v in x2.items()}
        status = "optimal" if st1 == st2 == "optimal" else "time_limit"
        if status == "time_limit":
            notes.append(
                "the MILP stopped on its time limit; the answer is the best found, not proven optimal"
            )
        return {k: v for k, v in plan2.items() if v}, status, notes

    def _warm(
        self,
        prob: pulp.LpProblem,
        x: dict[Key, pulp.LpVariable],
        T: pulp.LpVariable,
        plan: Mapping[Key, float],
    ) -> None:
        """Set every variable's initial value from a feasible plan (its simulated timeline)."""
        tl = simulate(self.dag, self.dag.durations(plan))
        byname = prob.variablesDict()
        for a, s in tl.start.items():
            byname[f"t_{a}"].setInitialValue(s)
        for k, var in x.items():
            var.setInitialValue(round(plan.get(k, 0.0)))
        T.setInitialValue(tl.makespan)
        counts: dict[tuple[int, int], float] = {}
        for (a, g), v in plan.items():
            counts[(a.stage, g)] = counts.get((a.stage, g), 0.0) + v
        for s, g in self.by_group:
            byname[f"signal_s{s}_g{g}"].setInitialValue(
                _pwl(self.loss[(s, g)], counts.get((s, g), 0.0))
            )


def _round_and_fill(dag: PipelineDag, model: _Model, lp_x: Mapping[Key, float]) -> dict[Key, float]:
    """Heuristic: round the LP down per group, then freeze more on the critical path while it helps."""
    plan: dict[Key, float] = {}
    for _sg, keys in sorted(model.by_group.items()):
        k_star = sum(lp_x.get(k, 0.0) for k in keys)
        n = min(math.floor(k_star + 1e-6), model.kmax)
        ranked = sorted(keys, key=lambda k: (-lp_x.get(k, 0.0), k[0].microbatch))
        for k in ranked[:n]:
            plan[k] = 1.0
    while (
        not model.fits(plan) and plan
    ):  # rounding down keeps the budget; guard against numerical drift
        worst = max(plan, key=lambda k: (model.loss[(k[0].stage, k[1])][1], k))
        del plan[worst]
    budget_tries = 200 if len(dag.order) <= 20000 else 20
    makespan = simulate(dag, dag.durations(plan))
    for _ in range(budget_tries):
        cands = []
        for a in makespan.critical_path:
            for g, c in enumerate(dag.group_cost[a.stage]):
                k = (a, g)
                if c <= 0 or k in plan or k not in model.by_group.get((a.stage, g), ()):
                    continue
                trial = dict(plan)
                trial[k] = 1.0
                if model.fits(trial):
                    d_sig = model.signal_of(trial) - model.signal_of(plan)
                    cands.append((-c / max(d_sig, 1e-12), str(a), g, k))
        improved = False
        for *_, k in sorted(cands, key=lambda c: c[:3])[:4]:
            trial = dict(plan)
            trial[k] = 1.0
            tl = simulate(dag, dag.durations(trial))
            if tl.makespan < makespan.makespan - 1e-9:
                plan, makespan, improved = trial, tl, True
                break
        if not improved:
            break
    return plan


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


def _write(prob: pulp.LpProblem, path: Path | None, *, phase: int) -> None:
    if path is None:
        return
    p = Path(path)
    if phase == 2:
        p = p.with_name(f"{p.stem}.phase2{p.suffix or '.lp'}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix.lower() == ".mps":
            prob.writeMPS(str(p))
        else:
            prob.writeLP(str(p))
    except OSError as e:
        raise InputError(f"cannot write the model to {p}: {e.strerror or e}") from None


def _solver(opts: SolveOptions, *, time_limit: float | None, warm: bool) -> pulp.LpSolver:
    if opts.solver == "highs":
        if not pulp.HiGHS().available():
            raise SolverError("HiGHS is not available: pip install highspy, or use --solver cbc")
        import highspy

        # HiGHS keeps one process-wide thread scheduler; an earlier model with another thread count
        # makes the next solve fail ("scheduler has already been initialized"). Start afresh.
        highspy.Highs.resetGlobalScheduler(True)
        return pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=opts.gap, threads=opts.threads)
    # PuLP 3.3 bundles CBC; its PULP_CBC_CMD wrapper is deprecated, so call the bundled binary
    # through COIN_CMD (the path PuLP 4 keeps), or a `cbc` on PATH.
    from pulp.apis import coin_api

    path = coin_api.PULP_CBC_CMD.pulp_cbc_path
    if not os.access(path, os.X_OK):
        path = coin_api.cbc_path
    solver = pulp.COIN_CMD(
        path=path,
        msg=False,
        timeLimit=time_limit,
        gapRel=opts.gap,
        threads=opts.threads,
        warmStart=warm,
    )
    if not solver.available():
        raise SolverError(
            "CBC is not available: install pulp==3.3.2 (it bundles CBC) or use --solver highs"
        )
    return solver


def _run(prob: pulp.LpProblem, opts: SolveOptions, *, time_limit: float | None, warm: bool) -> str:
    """Solve; return `optimal`, `time_limit` (feasible, not proven), `infeasible` or `no_solution`."""
    solver = _solver(opts, time_limit=time_limit, warm=warm)
    try:
        with stdout_to_stderr():
            prob.solve(solver)
    except pulp.PulpSolverError as e:
        raise SolverError(f"{opts.solver} failed: {str(e).splitlines()[0]}") from None
    # PuLP reports "Optimal" when CBC stops on its time limit with an incumbent: read sol_status.
    if prob.sol_status == pulp.LpSolutionOptimal and prob.status == pulp.LpStatusOptimal:
        return "optimal"
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return "time_limit"
    if prob.status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible"
    return "no_solution"
