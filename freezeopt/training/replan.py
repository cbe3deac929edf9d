"""Online re-planning during `freezeopt train`: solve again from the run's own measured costs.

Why: a schedule is solved once from a profile, but a run's timings drift (a straggling stage, a
busier host, thermal limits); the plan that was optimal for the profile then freezes work that is
no longer on the critical path. With re-planning on, `freezeopt train` re-solves every K steps or
when the step-time drift rule fires, from the action costs it measured in its last `WINDOW` steps,
and switches every rank to the new plan at the same step boundary (`freezeopt.training.rank` does the
lockstep; this module is the torch-free part: the cost window and the solve).

The costs: per action, the median over the window of its measured cost (the same thread-CPU or
CUDA-event cost the profiler measures). An action measured in a freezing step skipped some of its
groups' weight-gradient work; the profile's cost of what it skipped is added back, so every sample
estimates the action's full cost. The profile's per-group costs, lags and signal estimates are
kept: only the actions' durations change. A weight-gradient action is never taken as cheaper than
the profile's group costs it holds (the solver subtracts them).

From measured loss costs (`ReplanSpec.costs`, `freezeopt train --adaptive`): at the end of each
full-update window the run hands over what the window measured of freezing's cost in loss
(`WindowCosts`: each group's loss-change allocation on the held-out probe over the window's last
`LCA_STEPS` steps at most, from the probe's gradient at their two ends — a trapezoid over the
stretch, two probe passes per window instead of one per step — and the probe loss there: what
`freezeopt profile` measures per step, `freezeopt.profiling.loss_cost`), which replaces the
profile's; the solve is then the time-to-quality one (`solve_ttq`, the `measured` sensitivity,
under the schedule's budget cap), and the new plan is adopted when it promises less time to quality
than the current plan does on the same updated model by the solver's margin (`TTQ_MARGIN`: noisy
windows would otherwise swap near-equal plans), when it freezes nothing (no plan pays), or when
the current plan now drops more than the cap. Freezing so grows when the groups' shares of the
progress move away from the cheap-to-freeze ones, shrinks when they move towards them, and stops
while no plan pays.

The solve: `freezeopt.solver.modes.solve` in the re-plan mode (`heuristic` by default; `lp` or `milp`
on request) with the schedule's own budget, caps, sensitivity estimator and tolerance from its
provenance, a time limit, and `fallback="heuristic"`. The `lp` and `heuristic` re-plans solve the
LP relaxation with HiGHS whatever solver the schedule names (its optimum is the same; a `milp`
re-plan keeps the schedule's solver), so that a run's re-plans share one model
(`freezeopt.solver.lp_arrays.LpCache`): each re-solves the last from its basis, since only action costs
changed. Both the current plan and the new one are simulated on the updated costs; the new plan
is adopted when it is not predicted slower and differs from the current one. The new plan is a
complete schedule file (the old one's phases, drift rules and realisation; its prediction on the
updated costs) with a comment line saying where it came from.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from freezeopt.errors import MismatchError
from freezeopt.formats.profile import Probe, Profile
from freezeopt.formats.schedule import (
    PipelineShape,
    Schedule,
    dump_schedule,
    pipeline_difference,
)
from freezeopt.model.dag import PipelineDag, build_dag, schedule_plan
from freezeopt.model.sensitivity import ESTIMATORS, estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import (
    SOLVERS,
    FreezeProblem,
    Mode,
    SolveOptions,
    schedule_from_result,
    solve,
    solve_ttq,
)
from freezeopt.solver.lp_arrays import LpCache
from freezeopt.solver.ttq import TTQ_MARGIN

__all__ = [
    "LCA_STEPS",
    "MIN_SAMPLES",
    "WINDOW",
    "CostWindow",
    "ReplanOutcome",
    "ReplanSpec",
    "WindowCosts",
    "check_profile_fits",
    "measured_dag",
    "profile_dag",
    "replan",
    "skipped_ms",
    "solve_options",
    "with_window_costs",
]

WINDOW = 5
"""Measured steps whose action costs a re-plan uses (medians over them)."""
MIN_SAMPLES = 3
"""Measured steps needed in the window before a re-plan may start."""
LCA_STEPS = 3
"""Steps at the end of a full-update window (or of warm-up) whose loss costs an adaptive run
measures: the latest, and few enough for one trapezoid to follow the loss."""

Reason = Literal["every", "step_time", "costs"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanSpec:
    """Online re-planning settings for one training run (picklable: it travels to every rank)."""

    profile: Profile
    """The profile the schedule was solved from: DAG, group costs, lags, signal traces."""
    profile_sha256: str
    every: int = 0
    """Re-plan after every step `k` with `(k + 1) % every == 0` (0: never on a period)."""
    on_drift: bool = False
    """Re-plan when the step-time drift rule fires (instead of falling back to full updates)."""
    mode: Mode = "heuristic"
    time_limit: float = 10.0
    """Seconds for one solve."""
    costs: bool = False
    """Re-plan at the end of each full-update window from the loss costs measured in it, by time
    to quality (`WindowCosts`; the module docstring)."""

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.on_drift or self.costs


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowCosts:
    """What one full-update window measured of freezing's cost in loss."""

    loss_change: Mapping[tuple[int, str], tuple[float, ...]]
    """(stage, group) → its loss-change allocation on the probe in each measured stretch (a run
    measures one per window: its last `LCA_STEPS` steps at most)."""
    probe_loss: tuple[float, ...]
    """The probe loss before each stretch and after the last."""
    steps: int = 1
    """Optimizer steps the stretches span together."""

    def __post_init__(self) -> None:
        if self.steps < max(1, len(self.probe_loss) - 1):
            raise ValueError(
                f"a window's costs span at least one step and one per stretch, not {self.steps}"
            )

    @property
    def allocated(self) -> float:
        """The groups' shares summed: the probe loss's change, to second order."""
        return sum(sum(v) for v in self.loss_change.values())

    def summary(self) -> dict[str, Any]:
        """What a `replan*` event says the window measured: its steps, the probe loss at its
        start and end, and the groups' shares of the change together."""
        return {
            "steps": self.steps,
            "probe_loss": [self.probe_loss[0], self.probe_loss[-1]],
            "allocated": self.allocated,
        }


def with_window_costs(profile: Profile, costs: WindowCosts) -> Profile:
    """`profile` with its measured loss costs replaced by `costs` (the branch runs' calibration
    kept): what the `measured` sensitivity reads."""
    missing = [
        (t.stage, t.group) for t in profile.gradients if (t.stage, t.group) not in costs.loss_change
    ]
    if missing:
        raise ValueError(
            f"the window measured no loss change for stage {missing[0][0]} group {missing[0][1]!r}"
        )
    steps = {len(v) for v in costs.loss_change.values()}
    if len(steps) != 1 or len(costs.probe_loss) != steps.pop() + 1:
        raise ValueError("a window's loss changes and probe losses must cover the same steps")
    traces = tuple(
        replace(t, loss_change=tuple(costs.loss_change[(t.stage, t.group)]))
        for t in profile.gradients
    )
    old = profile.probe
    probe = Probe(
        batches=old.batches if old is not None else 1,
        loss=costs.probe_loss,
        branch=old.branch if old is not None else None,
    )
    return replace(profile, gradients=traces, probe=probe)


class CostWindow:
    """Per action, its full-cost estimates (ms) in the last `size` measured steps."""

    def __init__(self, size: int = WINDOW) -> None:
        self._steps: deque[dict[str, float]] = deque(maxlen=size)

    def add(self, costs: Mapping[str, float]) -> None:
        """One measured step: action → cost, with what it skipped already added back."""
        self._steps.append(dict(costs))

    def __len__(self) -> int:
        return len(self._steps)

    def medians(self) -> dict[str, float]:
        """Action → median full-cost estimate over the window."""
        samples: dict[str, list[float]] = {}
        for step in self._steps:
            for a, c in step.items():
                samples.setdefault(a, []).append(c)
        return {a: statistics.median(v) for a, v in sorted(samples.items())}


def skipped_ms(
    group_cost: Sequence[float],
    units: frozenset[int],
    *,
    unit: str = "group",
    tensors: Sequence[int] = (),
) -> float:
    """The profile's cost (ms) of the weight-gradient work a backward skipped: the frozen groups'
    costs, or for tensor units (`random_tensors`) each group's cost times the share of its
    `tensors[g]` parameter tensors that were frozen."""
    if unit == "group":
        return sum(group_cost[g] for g in units)
    out, first = 0.0, 0
    for g, n in enumerate(tensors):
        k = sum(1 for u in units if first <= u < first + n)
        if n and k:
            out += group_cost[g] * k / n
        first += n
    return out


_BASE: list[tuple[Profile, PipelineDag]] = []
"""The last profile re-planned from in this process and its DAG (one run re-plans from one)."""


def profile_dag(profile: Profile) -> PipelineDag:
    """`build_dag(profile)`, built once for a run's re-plans: the same profile object gives the
    same DAG (1.7 s to build at ZBV 64×256), which `measured_dag` copies, never changes."""
    if _BASE and _BASE[0][0] is profile:
        return _BASE[0][1]
    dag = build_dag(profile)
    _BASE[:] = [(profile, dag)]
    return dag


def measured_dag(dag: PipelineDag, measured: Mapping[str, float]) -> PipelineDag:
    """`dag` with its action durations replaced by `measured` (action name → full cost, ms) where
    given; a weight-gradient action is never cheaper than its stage's group costs together."""
    cost = dict(dag.cost)
    for a in dag.order:
        c = measured.get(str(a))
        if c is None:
            continue
        floor = sum(dag.group_cost[a.stage]) if a.has_weight_grad else 0.0
        cost[a] = max(float(c), floor)
    return replace(dag, cost=cost)


def check_profile_fits(schedule: Schedule, profile: Profile, *, source: str) -> None:
    """Raise MismatchError when `profile` is not of the pipeline `schedule` was made for."""
    diff = pipeline_difference(schedule, PipelineShape.of_profile(profile))
    if diff is not None:
        what, a, b = diff
        raise MismatchError(
            f"profile {source} does not fit the schedule: {what} is {b} in the profile but {a} "
            "in the schedule; re-plan from the profile the schedule was solved from"
        )


def solve_options(schedule: Schedule, spec: ReplanSpec) -> SolveOptions:
    """The schedule's own budget, caps, estimator and tolerance, in the re-plan mode (HiGHS for
    `lp` and `heuristic`, the schedule's solver for `milp`)."""
    prov = schedule.provenance
    solver = prov.solver if prov.solver in SOLVERS else "cbc"
    if spec.mode != "milp":
        solver = "highs"  # the same LP optimum, and warm re-solves (module docstring)
    sens = prov.sensitivity if prov.sensitivity in ESTIMATORS else "gns"
    return SolveOptions(
        mode=spec.mode,
        solver=solver,
        budget=prov.budget,
        group_cap=prov.group_cap,
        stage_cap=prov.stage_cap,
        sensitivity=sens,
        tolerance=prov.tolerance,
        time_limit=spec.time_limit,
        fallback="heuristic",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanOutcome:
    """One re-plan's answer."""

    schedule: Schedule
    """The new plan as a schedule file (its prediction on the updated costs)."""
    text: str
    """Its YAML text (a comment line, then `dump_schedule`)."""
    adopted: bool
    """Switch to it: predicted no slower than the current plan and different from it."""
    why: str
    """Why it is or is not adopted."""
    old_predicted_ms: float
    """The current plan's step time simulated on the updated costs."""
    new_predicted_ms: float
    baseline_ms: float
    """Nothing frozen, on the updated costs."""
    status: str
    solve_s: float
    warm: bool = False
    """The LP relaxation was re-solved from the last re-plan's basis."""


def replan(
    spec: ReplanSpec,
    current: Schedule,
    measured: Mapping[str, float],
    *,
    step: int,
    reason: str,
    lp_cache: LpCache | None = None,
    costs: WindowCosts | None = None,
) -> ReplanOutcome:
    """Solve again on `measured` costs (action name → full cost, ms), and with `costs` on the loss
    costs a full-update window measured, by time to quality; see the module docstring. Pass the
    same `lp_cache` to every re-plan of a run to re-solve its LP warm."""
    t0 = time.perf_counter()
    profile = spec.profile
    check_profile_fits(current, profile, source=f"sha256 {spec.profile_sha256[:12]}")
    dag = measured_dag(profile_dag(profile), measured)
    opts = solve_options(current, spec)
    warm_before = lp_cache.warm_solves if lp_cache is not None else 0
    if costs is not None:
        profile = with_window_costs(profile, costs)
        prov = current.provenance
        cap = prov.budget_cap if prov.budget_cap is not None else prov.budget
        opts = replace(opts, objective="ttq", sensitivity="measured", budget=cap)
        signal = estimate_signal(profile, "measured")
        result = solve_ttq(dag, signal, opts, lp_cache=lp_cache)
    else:
        result = solve(dag, estimate_signal(profile, opts.estimator), opts, lp_cache=lp_cache)
    new = schedule_from_result(
        result,
        profile=profile,
        profile_sha256=spec.profile_sha256,
        dag=dag,
        opts=opts,
        phases=current.phases,
        realisation=current.realisation,
    )
    old_plan = schedule_plan(current, dag)
    old_ms = simulate(dag, dag.durations(old_plan)).makespan
    new_ms = result.predicted_ms
    same = new.frozen == current.frozen and new.ratios == current.ratios
    if costs is not None:
        # time to quality of both plans on the window's model: step ratio over progress kept; a
        # current plan that now drops more than the cap is out, whatever it promises
        base = result.baseline_ms
        problem = FreezeProblem(dag, signal, opts)
        kept = 1.0 - problem.signal_of(old_plan)
        fits = problem.fits(old_plan)
        old_ttq = (old_ms / base) / kept if kept > 0 and base > 0 and fits else float("inf")
        new_ttq = result.time_to_quality if result.time_to_quality is not None else float("inf")
    if same:
        adopted, why = False, "the same plan"
    elif costs is not None:
        # nothing frozen: no plan promises TTQ_MARGIN, so the current one does not pay either;
        # another freezing plan: only for a gain beyond the model's error (noisy windows would
        # swap near-equal plans back and forth)
        adopted = not result.frozen or not fits or new_ttq < old_ttq * (1.0 - TTQ_MARGIN)
        why = (
            f"time to quality x{new_ttq:.3f} of not freezing's against x{old_ttq:.3f} for the "
            "current plan on the window's loss costs"
            + ("" if fits else " (the current plan now drops more than the cap)")
        )
    elif new_ms > old_ms * (1 + 1e-9):
        adopted, why = False, "predicted slower than the current plan"
    else:
        adopted, why = True, "predicted no slower than the current plan"
    head = (
        f"# re-planned by `freezeopt train` after step {step} ({reason}) from measured action "
        f"costs: predicted {old_ms:.6g} ms (old plan) -> {new_ms:.6g} ms on them\n"
    )
    return ReplanOutcome(
        schedule=new,
        text=head + dump_schedule(new),
        adopted=adopted,
        why=why,
        old_predicted_ms=old_ms,
        new_predicted_ms=new_ms,
        baseline_ms=result.baseline_ms,
        status=result.status,
        solve_s=time.perf_counter() - t0,
        warm=lp_cache is not None and lp_cache.warm_solves > warm_before,
    )
