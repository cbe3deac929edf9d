"""Freezing policies to compare freezeopt against, each written as a schedule file.

Every policy becomes a schedule file that the same runtime replays, so a comparison changes the
plan and nothing else. All are built from one profile, at matched budgets where the notion applies
(the budget is freezeopt's: a share of one step's expected progress, from `sensitivity`):

* `none`: nothing frozen — the reference;
* `uniform`: every backward freezes the same number of groups, picked at random (seeded), as many
  as the budget allows; blind to the schedule and to which groups matter;
* `stability`: APF/AutoFreeze-style — freeze whole groups (every microbatch, so their gradient is
  `None` and they stop moving) in order of their stability statistic (lowest APF effective
  perturbation first, i.e. most converged), as many as the budget allows; blind to the schedule;
* `timelyfreeze`: a re-creation of TimelyFreeze — its LP (one freeze ratio per action, all of a
  stage's groups freezing together, per-stage mean cap 0.9, makespan first then least freezing),
  realised as round(r·n) random parameter tensors per microbatch, redrawn every 10 steps, with no
  gradient rescaling (`Realisation(kind="random_tensors", rescale=False)`);
* `timelyfreeze-matched`: the same, with the per-stage cap chosen instead of 0.9 so that its plan
  drops freezeopt's budget of signal, measured by the same estimator (`matched_stage_cap`:
  bisection on the cap) — TimelyFreeze at freezeopt's budget, the like-for-like point;
* `freezeopt` / `freezeopt-heuristic`: our MILP and heuristic, at the budget;
* `autofreeze`: AutoFreeze's rule (Liu et al., 2021) as a schedule `progression`: every 5 % of the
  N steps, the groups whose gradient norm changed least (at or below the median change of the
  groups still trained) join a frozen prefix, first group first, never the last; frozen whole,
  so the backward below them is truncated;
* `composer`: Composer's LayerFreezing defaults as a `progression`: from half of the N steps on,
  a prefix that grows linearly to every group but the last at step N;
* `freezeopt-ttq`: the MILP with the `ttq` objective and the `measured` sensitivity (where the
  profile has the probe loss; `gns` otherwise): the plan with the least predicted time to quality
  under the budget as a cap, or nothing frozen where freezing does not pay;
* `freezeopt-adaptive`: `freezeopt-ttq`'s plan to start from, with a full-update window of
  `ADAPTIVE_WINDOW` steps every sixth of the N steps, trained with `--adaptive`: each window (and
  the warm-up) measures what freezing costs in loss, and the run re-plans by time to quality from
  it (`freezeopt.training.replan`).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

from freezeopt.actions import Action
from freezeopt.errors import InputError
from freezeopt.formats.profile import GroupProfile, Profile, StageProfile, Stat, profile_sha256
from freezeopt.formats.schedule import Phases, Progression, Realisation, Schedule
from freezeopt.model.dag import PipelineDag, build_dag
from freezeopt.model.sensitivity import Estimator, GroupSignal, estimate_signal
from freezeopt.model.simulate import simulate
from freezeopt.solver import (
    FreezeProblem,
    SolveOptions,
    SolveResult,
    schedule_from_result,
    solve,
    solve_ttq,
)

__all__ = [
    "ADAPTIVE_WINDOW",
    "BUDGETED",
    "POLICIES",
    "Policy",
    "matched_stage_cap",
    "merged_profile",
    "policy_schedule",
]

Policy = Literal[
    "none",
    "uniform",
    "stability",
    "timelyfreeze",
    "timelyfreeze-matched",
    "freezeopt",
    "freezeopt-heuristic",
    "freezeopt-ttq",
    "freezeopt-adaptive",
    "autofreeze",
    "composer",
]
POLICIES: tuple[Policy, ...] = (
    "none",
    "uniform",
    "stability",
    "timelyfreeze",
    "timelyfreeze-matched",
    "freezeopt",
    "freezeopt-heuristic",
    "freezeopt-ttq",
    "freezeopt-adaptive",
    "autofreeze",
    "composer",
)
BUDGETED: tuple[Policy, ...] = tuple(
    p for p in POLICIES if p not in ("none", "timelyfreeze", "autofreeze", "composer")
)
"""The policies whose plan depends on the budget (a budget sweep runs these)."""
ADAPTIVE_WINDOW = 3
"""`freezeopt-adaptive`: the full-update steps of each window that measures the loss costs."""
MATCH_TOLERANCE = 0.01
"""`matched_stage_cap` stops when the signal dropped is within this share of the budget."""
Key = tuple[Action, int]


def policy_schedule(
    profile: Profile,
    policy: Policy,
    *,
    budget: float = 0.1,
    sensitivity: Estimator = "gns",
    phases: Phases | None = None,
    seed: int = 0,
    time_limit: float = 60.0,
    stage_cap: float = 0.9,
    total_steps: int = 120,
) -> tuple[Schedule, SolveResult]:
    """The schedule file of `policy` for `profile` (and the figures behind it).

    `stage_cap` is `timelyfreeze`'s cap; `timelyfreeze-matched` chooses its own from `budget`.
    `total_steps` is the run's length the progressive policies (`autofreeze`, `composer`) scale to.
    """
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    phases = phases or Phases()
    dag = build_dag(profile)
    signal = estimate_signal(profile, sensitivity)
    opts = SolveOptions(
        mode="lp", budget=budget, sensitivity=sensitivity, time_limit=time_limit, group_cap=1.0
    )
    sha = profile_sha256(profile)
    realisation = None
    progression: Progression | None = None
    if policy == "freezeopt-adaptive":
        phases = dataclasses.replace(
            phases,
            full_update_every=max(2 * ADAPTIVE_WINDOW, total_steps // 6),
            full_update_steps=ADAPTIVE_WINDOW,
        )
    if policy in ("freezeopt-ttq", "freezeopt-adaptive"):
        sensitivity = "measured" if profile.probe is not None else "gns"
        opts = SolveOptions(
            mode="milp",
            objective="ttq",
            budget=budget,
            sensitivity=sensitivity,
            time_limit=time_limit,
        )
        result = solve_ttq(dag, estimate_signal(profile, sensitivity), opts)
    elif policy in ("freezeopt", "freezeopt-heuristic"):
        opts = SolveOptions(
            mode="milp" if policy == "freezeopt" else "heuristic",
            budget=budget,
            sensitivity=sensitivity,
            time_limit=time_limit,
        )
        result = solve(dag, signal, opts)
    elif policy in ("timelyfreeze", "timelyfreeze-matched"):
        if policy == "timelyfreeze-matched":
            stage_cap, result = matched_stage_cap(
                profile, budget, sensitivity=sensitivity, time_limit=time_limit
            )
        else:
            result = _timelyfreeze(
                profile, dag, stage_cap=stage_cap, time_limit=time_limit, signal=signal
            )
        realisation = Realisation(kind="random_tensors", redraw_every=10, rescale=False, seed=seed)
        opts = SolveOptions(
            mode="lp", budget=1.0, group_cap=1.0, stage_cap=stage_cap, sensitivity="flat"
        )
    elif policy in ("autofreeze", "composer"):
        model = FreezeProblem(dag, signal, opts)
        result = _result_of(dag, model, {}, policy, budget)
        result = dataclasses.replace(
            result,
            notes=(
                f"{policy}: freezes a growing prefix of whole groups while training; the "
                "prediction is for its start, with nothing frozen",
            ),
        )
        if policy == "composer":
            progression = Progression(kind="linear", start=0.5, level=1.0, total_steps=total_steps)
        else:
            every = max(1, round(0.05 * total_steps))
            progression = Progression(kind="gradient_change", every=every, percentile=0.5)
    else:
        model = FreezeProblem(dag, signal, opts)
        if policy == "none":
            plan: dict[Key, float] = {}
        elif policy == "uniform":
            plan = _uniform(dag, model, seed)
        else:
            plan = _stability(profile, dag, model)
        result = _result_of(dag, model, plan, policy, budget)
    sched = schedule_from_result(
        result,
        profile=profile,
        profile_sha256=sha,
        dag=dag,
        opts=opts,
        phases=phases,
        realisation=realisation,
        label=policy,
    )
    if progression is not None:
        sched = dataclasses.replace(sched, progression=progression)
    return sched, result


def _result_of(
    dag: PipelineDag, model: FreezeProblem, plan: dict[Key, float], policy: str, budget: float
) -> SolveResult:
    baseline = simulate(dag).makespan
    predicted = simulate(dag, dag.durations(plan)).makespan
    floor = simulate(dag, dag.durations(dag.all_frozen())).makespan
    return SolveResult(
        status="policy",
        mode="heuristic",
        solver="cbc",
        baseline_ms=baseline,
        all_frozen_ms=floor,
        lp_bound_ms=floor,
        predicted_ms=predicted,
        gap=(predicted - floor) / predicted if predicted else 0.0,
        signal_dropped=model.signal_of(plan),
        solve_seconds=0.0,
        frozen=dict(sorted(plan.items())),
        budget=budget,
        notes=(f"{policy}: lp_bound_ms is the all-frozen floor (no LP solved)",),
        bound_from_lp=False,
    )


def _backwards(dag: PipelineDag) -> list[Action]:
    return [a for a in dag.order if a.has_weight_grad]


def _uniform(dag: PipelineDag, model: FreezeProblem, seed: int) -> dict[Key, float]:
    """The same number of random groups in every backward; the most the budget allows."""
    acts = _backwards(dag)
    best: dict[Key, float] = {}
    n_max = max((len(dag.group_names[a.stage]) for a in acts), default=0)
    # total freezes N spread evenly: each action gets N // A or one more, groups drawn at random
    lo, hi = 0, len(acts) * n_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        plan = _spread(dag, acts, mid, seed)
        if model.signal_of(plan) <= model.opts.budget + 1e-12:
            lo, best = mid, plan
        else:
            hi = mid - 1
    return best if lo else {}


def _spread(dag: PipelineDag, acts: list[Action], total: int, seed: int) -> dict[Key, float]:
    rnd = random.Random(seed)
    plan: dict[Key, float] = {}
    per, extra = divmod(total, len(acts)) if acts else (0, 0)
    order = sorted(acts, key=lambda a: (a.microbatch, a.stage))
    extra_set = set(random.Random(seed + 1).sample(range(len(order)), extra)) if extra else set()
    for i, a in enumerate(order):
        n = min(len(dag.group_names[a.stage]), per + (1 if i in extra_set else 0))
        for g in rnd.sample(range(len(dag.group_names[a.stage])), n):
            plan[(a, g)] = 1.0
    return plan


def _stability(profile: Profile, dag: PipelineDag, model: FreezeProblem) -> dict[Key, float]:
    """Freeze the most stable groups entirely (every microbatch), while the budget allows."""
    traces = {(t.stage, t.group): t for t in profile.gradients}

    def stat(s: int, name: str) -> float:
        t = traces.get((s, name))
        ep = t.effective_perturbation if t is not None else ()
        return sum(ep) / len(ep) if ep else 1.0

    ranked = sorted(
        (
            (stat(s, name), s, g)
            for s, names in enumerate(dag.group_names)
            for g, name in enumerate(names)
        ),
    )
    plan: dict[Key, float] = {}
    acts = _backwards(dag)
    for _, s, g in ranked:
        trial = dict(plan)
        for a in acts:
            if a.stage == s:
                trial[(a, g)] = 1.0
        if model.signal_of(trial) <= model.opts.budget + 1e-12:
            plan = trial
    return plan


def merged_profile(profile: Profile) -> Profile:
    """The profile with each stage's groups merged into one (`all`), as TimelyFreeze sees a stage."""
    stages = []
    for st in profile.stages:
        cost = sum(g.weight_grad_ms.median for g in st.groups)
        merged = GroupProfile(
            name="all",
            params=tuple(p for g in st.groups for p in g.params),
            numel=sum(g.numel for g in st.groups),
            weight_grad_ms=Stat(
                median=cost,
                p10=cost,
                p90=cost,
                n=max((g.weight_grad_ms.n for g in st.groups), default=0),
            ),
        )
        stages.append(StageProfile(stage=st.stage, rank=st.rank, groups=(merged,)))
    return dataclasses.replace(profile, stages=tuple(stages), gradients=())


def matched_stage_cap(
    profile: Profile,
    budget: float,
    *,
    sensitivity: Estimator = "gns",
    time_limit: float = 60.0,
    tolerance: float = MATCH_TOLERANCE,
    max_iter: int = 40,
) -> tuple[float, SolveResult]:
    """The TimelyFreeze per-stage cap whose plan drops `budget` of the signal, and that plan.

    TimelyFreeze has no accuracy budget, only the cap on each stage's mean freeze ratio; a higher
    cap lets its LP freeze more. The signal a plan drops is measured by `sensitivity`, the estimator
    freezeopt's budget is stated in. Bisection on the cap in [0, 1] (deterministic: the same
    profile gives the same cap) until the plan drops `budget` within `tolerance`·`budget`; if no
    cap gets that close (the plan can jump between LP vertices), the closer of the two bracketing
    caps. When even cap 1 drops less than `budget`, the answer is cap 1 (TimelyFreeze cannot spend
    more); the result's notes say so.
    """
    if not 0.0 <= budget <= 1.0:
        raise InputError(f"budget {budget:g} is outside [0, 1]")
    dag = build_dag(profile)
    signal = estimate_signal(profile, sensitivity)
    tol = max(tolerance * budget, 1e-9)

    def at(cap: float) -> SolveResult:
        return _timelyfreeze(profile, dag, stage_cap=cap, time_limit=time_limit, signal=signal)

    def done(cap: float, r: SolveResult, how: str) -> tuple[float, SolveResult]:
        note = (
            f"timelyfreeze-matched: stage cap {cap:.6f} drops {r.signal_dropped:.6f} of the signal "
            f"({sensitivity}) against a budget of {budget:g} ({how})"
        )
        return cap, dataclasses.replace(r, budget=budget, notes=(*r.notes, note))

    hi, hi_r = 1.0, at(1.0)
    if hi_r.signal_dropped <= budget + tol:
        return done(hi, hi_r, "cap 1: TimelyFreeze cannot drop more")
    lo, lo_r = 0.0, None
    for _ in range(max_iter):
        mid = round((lo + hi) / 2, 9)
        if not lo < mid < hi:
            break
        r = at(mid)
        if abs(r.signal_dropped - budget) <= tol:
            return done(mid, r, "matched")
        if r.signal_dropped < budget:
            lo, lo_r = mid, r
        else:
            hi, hi_r = mid, r
    if lo_r is None:
        lo_r = at(lo)
    cap, r = min(
        ((lo, lo_r), (hi, hi_r)), key=lambda cr: (abs(cr[1].signal_dropped - budget), cr[0])
    )
    return done(cap, r, "closest cap; the plan jumps here")


def _timelyfreeze(
    profile: Profile,
    dag: PipelineDag,
    *,
    stage_cap: float,
    time_limit: float,
    signal: tuple[tuple[GroupSignal, ...], ...] | None,
) -> SolveResult:
    """TimelyFreeze's LP on the merged profile; its per-action ratio applies to every group of the
    stage. `signal_dropped` is that plan measured by `signal` (freezeopt's estimator)."""
    merged = merged_profile(profile)
    mdag = build_dag(merged)
    opts = SolveOptions(
        mode="lp",
        budget=1.0,
        group_cap=1.0,
        stage_cap=stage_cap,
        sensitivity="flat",
        time_limit=time_limit,
    )
    r = solve(mdag, estimate_signal(merged, "flat"), opts)
    ratio = {a: x for (a, _), x in r.frozen.items()}
    frozen = {(a, g): x for a, x in ratio.items() for g in range(len(dag.group_names[a.stage]))}
    dropped = (
        FreezeProblem(dag, signal, SolveOptions()).signal_of(frozen) if signal else r.signal_dropped
    )
    return dataclasses.replace(
        r,
        frozen=frozen,
        signal_dropped=min(1.0, dropped),
        status="optimal",
        notes=(
            *r.notes,
            "timelyfreeze: signal_dropped is freezeopt's estimate of the same plan",
        ),
    )
