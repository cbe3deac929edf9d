"""Assembling a profile: what the ranks of `freezeopt profile` measured → the profile file and report.

Why apart from `freezeopt.profiling.run`: the ranks measure (that module), the parent turns their plain
picklable `RankResult`s into the file the solver reads. This is pure data work — statistics over
the measured steps, the executed order checked against the schedule, the measured timeline of the
median step, cross-rank lags from the wall timeline (ping-pong where the timeline has too few
samples), group costs fitted under the actions they belong to, the gradient traces — plus the
self-check: the DAG built from the new profile must predict the measured step time, and where it
misses by more than `SELF_CHECK_TOLERANCE` the report says why; `format_report` renders the report
for people. `freezeopt.profiling.run`'s docstring describes every measurement.
"""

from __future__ import annotations

import itertools
import math
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from freezeopt import __version__
from freezeopt.actions import Action
from freezeopt.errors import InputError
from freezeopt.formats.profile import (
    ActionCost,
    Branch,
    GradientTrace,
    GroupProfile,
    Lag,
    Pipeline,
    Probe,
    Profile,
    Provenance,
    RankProfile,
    StageProfile,
    Stat,
    TimelineEntry,
)
from freezeopt.model.sensitivity import measured_check
from freezeopt.profiling.loss_cost import branch_count, conservation
from freezeopt.torchpp.job import Job, job_sha256
from freezeopt.torchpp.pipeline import PipelinePlan

__all__ = [
    "APF_ALPHA",
    "SELF_CHECK_TOLERANCE",
    "ProfileReport",
    "RankResult",
    "assemble",
    "format_report",
    "loss_summary",
    "unmeasured_stages",
]

APF_ALPHA = 0.9
"""EMA factor of APF's effective perturbation."""
SELF_CHECK_TOLERANCE = 0.10
"""Relative step-time error above which the report explains the difference."""
_MIN_LAG_SAMPLES = 3
_FIT_MARGIN = 1e-4
OTHERS_BUSY = 0.1
"""Cores: other processes busier than this during a run make its timings unreliable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileReport:
    """The summary of one profiling run (the profile file holds everything)."""

    path: Path | None
    """Where the profile was written (under torchrun: by rank 0; every rank gets its report)."""
    job: str
    schedule: str
    world_size: int
    n_stages: int
    n_microbatches: int
    steps_measured: int
    device: str
    measured_step_ms: float
    """Median measured wall time of one pipeline step (barrier to last rank done)."""
    predicted_step_ms: float
    """Step time the profile's DAG predicts from the measured action costs and lags."""
    error: float
    """(predicted − measured) / measured."""
    explanation: str | None
    """Why prediction and measurement differ, where they differ by more than 10 %."""
    action_ms: tuple[tuple[int, int, str, float, float, int], ...]
    """(stage, rank, kind, median cost ms, median wall ms, actions) per stage and kind."""
    group_ms: tuple[tuple[int, str, float], ...]
    """(stage, group, weight-gradient ms per microbatch)."""
    lags_ms: tuple[tuple[int, int, str, float, str], ...]
    """(src stage, dst stage, kind, ms, method)."""
    optimizer_ms: tuple[float, ...]
    """Median optimizer-step time per rank."""
    loss: tuple[float, ...]
    """Training loss of the measured steps."""
    val_loss: tuple[float, ...]
    """Validation loss before and after training."""
    order_ok: bool
    """True when every rank executed exactly torch's (or the CSV's) order."""
    order_mismatches: tuple[str, ...]
    warnings: tuple[str, ...]
    wall_s: float
    """How long profiling took."""
    loss_cost: dict[str, Any] | None = None
    """What freezing costs in loss, as measured (`loss_summary`): the probe loss, how well the
    groups' shares add up to its changes, and the branch runs against the curves' prediction."""

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data (for `--json`)."""
        d = asdict(self)
        d["path"] = None if self.path is None else str(self.path)
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class RankResult:
    """Everything one rank measured, as plain picklable data."""

    rank: int
    host: str
    device: str
    stages: tuple[int, ...]
    records: tuple[tuple[int, int, str, int, float, float, float], ...]
    """(measured step, stage, kind, microbatch, wall start s, wall end s, cost ms)."""
    step_bounds: tuple[tuple[float, float], ...]
    """Per measured step: wall start and end (perf_counter seconds) of this rank's step()."""
    optimizer_ms: tuple[float, ...]
    optimizer_wall_ms: tuple[float, ...]
    losses: tuple[float, ...]
    """Mean microbatch loss of every step, warm-up included (last-stage rank only)."""
    val_loss: tuple[float, ...]
    groups: tuple[tuple[int, str, tuple[str, ...], int, str], ...]
    """(stage, group, parameter names, numel, fingerprint)."""
    mb_sq: dict[tuple[int, str], tuple[tuple[float, ...], ...]]
    step_sq: dict[tuple[int, str], tuple[float, ...]]
    apf: dict[tuple[int, str], tuple[float, ...]]
    cost_rounds: dict[int, dict[str, tuple[float, ...]]]
    """Per stage: 'all', 'none' and each group's leave-one-out samples (ms); for stages whose
    backward runs whole, 'truncation.j' too (`StageProfile.truncation_ms`)."""
    cost_modes: dict[int, str]
    """Per stage: `full` (costs measured in a full backward) or `split` (in torch's W step)."""
    pingpong: dict[tuple[int, int], tuple[float, ...]]
    """(src rank, dst rank) → one-way ms samples (measured on the sending side)."""
    act_shapes: dict[int, tuple[tuple[int, ...], str]]
    data_provenance: dict[str, Any]
    warnings: tuple[str, ...] = ()
    probe_losses: tuple[float | None, ...] = ()
    """The probe loss before each measured step and after the last (None off the last stage's
    rank); empty where not measured (`freezeopt.profiling.loss_cost`)."""
    loss_change: dict[tuple[int, str], tuple[float, ...]] = field(default_factory=dict)
    """Per group of this rank: its loss-change allocation per measured step."""
    all_grouped: dict[int, bool] = field(default_factory=dict)
    """Per stage of this rank: whether every trainable parameter is in a group."""
    branch: tuple[float, float, float] | None = None
    """Probe loss at the branch runs' start, after full updates and after freezing (last stage's
    rank; None elsewhere or not run)."""


def _probe(job: Job, last: RankResult) -> Probe | None:
    """The probe losses and branch runs the last stage's rank measured, or None where they were
    not measured or a loss was not finite (a diverged probe says nothing about freezing)."""
    losses = last.probe_losses
    if not losses or any(v is None or not math.isfinite(v) for v in losses):
        return None
    branch = None
    if last.branch is not None:
        start, full, frozen = last.branch
        branch = Branch(
            steps=job.branch_steps,
            frozen_share=branch_count(job.microbatches) / job.microbatches,
            loss_start=start,
            loss_full=full,
            loss_frozen=frozen,
        )
    return Probe(
        batches=job.probe_batches,
        loss=tuple(float(v) for v in losses if v is not None),
        branch=branch,
    )


def loss_summary(profile: Profile) -> dict[str, Any] | None:
    """The measured loss cost, checked both ways (None without a probe): `conservation_r2`, how
    much of the probe loss's per-step changes the groups' allocations explain (1: all); and the
    branch runs' frozen plan, the share of the full run's progress it kept against what the
    `measured` curves predicted (before they are scaled up to it)."""
    probe = profile.probe
    if probe is None:
        return None
    changes = [b - a for a, b in itertools.pairwise(probe.loss)]
    allocated = [sum(t.loss_change[i] for t in profile.gradients) for i in range(len(changes))]
    out: dict[str, Any] = {
        "probe_loss": [probe.loss[0], probe.loss[-1]],
        "steps": len(changes),
        "conservation_r2": conservation(changes, allocated),
    }
    try:
        check = measured_check(profile)
    except InputError:  # a profile the measured sensitivity cannot read (one microbatch)
        check = None
    if probe.branch is not None and check is not None:
        out["branch"] = {
            "steps": probe.branch.steps,
            "frozen_share": probe.branch.frozen_share,
            "kept": 1.0 - check[1],
            "kept_predicted": 1.0 - check[0],
        }
    return out


def _pct(v: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of sorted `v`."""
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _clipped_median(xs: Sequence[float]) -> float:
    """The median `_stat` stores (scale 1): each sample clipped at 0 first. (The raw samples'
    median, clipped after, is smaller where some are negative, as timing differences are under
    load.)"""
    return float(statistics.median(max(0.0, x) for x in xs))


def unmeasured_stages(stages: Sequence[StageProfile]) -> list[str]:
    """A warning per stage whose every group cost came out 0: the leave-one-out differences were
    all within the timing noise, so the solver sees nothing to save there and freezes nothing in
    it (a tiny stage, a busy host, or too few rounds)."""
    return [
        f"stage {st.stage}: every group's weight-gradient cost measured 0 ms (within the timing "
        f"noise over {st.groups[0].weight_grad_ms.n} rounds), so nothing will be frozen there; raise "
        "cost_samples or re-profile on a quieter machine"
        for st in stages
        if st.groups and all(g.weight_grad_ms.median == 0 for g in st.groups)
    ]


def fit_scales(
    groups: Sequence[Sequence[float]], truncation: Sequence[Sequence[float]] | None, cap: float
) -> tuple[float, float]:
    """Factors for a stage's group-cost samples and truncation-gain samples so that, as the file
    stores them (`_stat`: clipped, scaled, median), the group costs and then the gains together
    fit in `cap`, its fastest weight-gradient action, with `_FIT_MARGIN` to spare (the file
    rounds to 6 digits) — the DAG refuses a profile where they do not."""
    total = sum(_clipped_median(g) for g in groups)
    fit = cap * (1 - _FIT_MARGIN)
    scale = fit / total if total > fit > 0 else 1.0
    if truncation is None:
        return scale, scale
    gains = sum(_clipped_median(t) for t in truncation)
    room = max(0.0, fit - total * scale) if fit > 0 else 0.0
    t_scale = scale
    if gains * scale > room:
        t_scale = room / gains if gains > 0 else 0.0
    return scale, t_scale


def _stat(xs: Sequence[float], *, scale: float = 1.0) -> Stat:
    v = sorted(max(0.0, x * scale) for x in xs)
    return Stat(median=statistics.median(v), p10=_pct(v, 10), p90=_pct(v, 90), n=len(v))


def _order_key(a: Action) -> tuple[int, int, int]:
    return (a.stage, a.microbatch, "FBIW".index(a.kind))


@dataclass(slots=True)
class _Run:
    """Per measured step: each action's (rank, start, end, cost) and each rank's executed order."""

    steps: list[dict[Action, tuple[int, float, float, float]]] = field(default_factory=list)
    orders: list[list[list[Action]]] = field(default_factory=list)


def _collect(plan: PipelinePlan, results: Sequence[RankResult], n_steps: int) -> _Run:
    run = _Run()
    for _ in range(n_steps):
        run.steps.append({})
        run.orders.append([[] for _ in results])
    for res in results:
        for k, s, kind, mb, t0, t1, cost in res.records:
            a = Action(s, kind, mb)  # type: ignore[arg-type]
            run.steps[k][a] = (res.rank, t0, t1, cost)
            run.orders[k][res.rank].append(a)
    return run


def assemble(
    job: Job,
    plan: PipelinePlan,
    results: Sequence[RankResult],
    *,
    out: Path,
    host: dict[str, Any],
    wall_s: float,
) -> tuple[Profile, ProfileReport]:
    """The profile and the report from every rank's `RankResult` (writes nothing)."""
    from freezeopt.model.dag import build_dag
    from freezeopt.model.simulate import simulate
    from freezeopt.torchpp.adapter import torch_version

    n_steps = job.measure_steps
    run = _collect(plan, results, n_steps)
    warnings: list[str] = [w for r in results for w in r.warnings]
    others = host.get("other_cpu_cores")
    if others is not None and others > OTHERS_BUSY:
        warnings.append(
            f"other processes kept {others:.2f} cores busy during the run; timings are unreliable, "
            "re-profile on a quiet machine"
        )

    # executed order versus the schedule
    mismatches: list[str] = []
    for r in range(job.ranks):
        expected = list(plan.rank_actions[r])
        for k in range(n_steps):
            got = run.orders[k][r]
            if got != expected:
                i = next(
                    (j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                    min(len(got), len(expected)),
                )
                exp = str(expected[i]) if i < len(expected) else "end"
                gotten = str(got[i]) if i < len(got) else "end"
                mismatches.append(
                    f"rank {r} step {k}: position {i} ran {gotten}, schedule says {exp}"
                )
                break
    executed = [list(run.orders[0][r]) for r in range(job.ranks)]
    all_actions = sorted({a for st in run.steps for a in st}, key=_order_key)

    costs = {a: [st[a][3] for st in run.steps if a in st] for a in all_actions}
    walls = {a: [(st[a][2] - st[a][1]) * 1e3 for st in run.steps if a in st] for a in all_actions}
    action_costs = tuple(ActionCost(action=str(a), cost_ms=_stat(costs[a])) for a in all_actions)
    cost_med = {a: statistics.median(costs[a]) for a in all_actions}

    # step time and timeline
    same_host = len({r.host for r in results}) == 1
    step_ms: list[float] = []
    starts: list[float] = []
    for k in range(n_steps):
        if same_host:
            s0 = min(r.step_bounds[k][0] for r in results)
            step_ms.append((max(r.step_bounds[k][1] for r in results) - s0) * 1e3)
            starts.append(s0)
        else:
            step_ms.append(max(r.step_bounds[k][1] - r.step_bounds[k][0] for r in results) * 1e3)
            starts.append(0.0)
    med_step = sorted(range(n_steps), key=lambda k: (step_ms[k], k))[(n_steps - 1) // 2]
    timeline: list[TimelineEntry] = []
    for a in sorted(run.steps[med_step], key=lambda a: (run.steps[med_step][a][1], _order_key(a))):
        rk, t0, t1, _ = run.steps[med_step][a]
        base = starts[med_step] if same_host else results[rk].step_bounds[med_step][0]
        timeline.append(
            TimelineEntry(
                action=str(a),
                rank=rk,
                start_ms=max(0.0, (t0 - base) * 1e3),
                end_ms=max(0.0, (t1 - base) * 1e3),
            )
        )

    # lags
    lags, lag_detail = _lags(plan, run, results, same_host)

    # stages and groups
    rank_of_stage = plan.stage_rank
    group_meta = {
        (s, g): (names, numel, fp) for r in results for s, g, names, numel, fp in r.groups
    }
    rounds = {s: d for r in results for s, d in r.cost_rounds.items()}
    grouped = {s: v for r in results for s, v in r.all_grouped.items()}
    modes = {s: m for r in results for s, m in r.cost_modes.items()}
    stages: list[StageProfile] = []
    group_detail: dict[str, Any] = {}
    for s in range(plan.n_stages):
        names = [g for (st, g) in group_meta if st == s]
        n_trunc = len(names) + 1
        keys = [f"truncation.{j}" for j in range(n_trunc)]
        trunc_rounds = [rounds[s][k] for k in keys] if all(k in rounds[s] for k in keys) else None
        wb = [cost_med[a] for a in all_actions if a.stage == s and a.kind in ("B", "W")]
        total = sum(_clipped_median(rounds[s][g]) for g in names)
        cap = min(wb) if wb else total
        scale, t_scale = fit_scales([rounds[s][g] for g in names], trunc_rounds, cap)
        if scale < 1.0:
            warnings.append(
                f"stage {s}: group costs ({total:.2f} ms) exceeded its fastest weight-gradient action "
                f"({cap:.2f} ms); scaled by {scale:.3f}"
            )
        all_ms = statistics.median(rounds[s]["all"])
        none_ms = statistics.median(rounds[s]["none"])
        group_detail[str(s)] = {
            "measured_in": modes[s],
            "all_groups_ms": all_ms,
            "no_groups_ms": none_ms,
            "weight_grad_ms": all_ms - none_ms,
            "groups_sum_ms": total,
            "scaled_by": scale,
            "pipeline_weight_actions_min_ms": cap,
        }
        groups = tuple(
            GroupProfile(
                name=g,
                params=group_meta[(s, g)][0],
                numel=group_meta[(s, g)][1],
                fingerprint=group_meta[(s, g)][2],
                weight_grad_ms=_stat(rounds[s][g], scale=scale),
            )
            for g in names
        )
        truncation: tuple[Stat, ...] = ()
        if trunc_rounds is not None:
            truncation = tuple(_stat(t, scale=t_scale) for t in trunc_rounds)
            group_detail[str(s)]["truncation_scaled_by"] = t_scale
        stages.append(
            StageProfile(
                stage=s,
                rank=rank_of_stage[s],
                groups=groups,
                truncation_ms=truncation,
                all_grouped=grouped.get(s),
            )
        )

    warnings.extend(unmeasured_stages(stages))

    # gradient traces
    traces: list[GradientTrace] = []
    if job.gradient_traces:
        mb_sq = {k: v for r in results for k, v in r.mb_sq.items()}
        st_sq = {k: v for r in results for k, v in r.step_sq.items()}
        apf = {k: v for r in results for k, v in r.apf.items()}
        lca = {k: v for r in results for k, v in r.loss_change.items()}
        for s in range(plan.n_stages):
            for g in (g for (st, g) in group_meta if st == s):
                traces.append(
                    GradientTrace(
                        stage=s,
                        group=g,
                        microbatch_sq_norms=mb_sq[(s, g)],
                        step_sq_norms=st_sq[(s, g)],
                        effective_perturbation=apf.get((s, g), ()),
                        loss_change=lca.get((s, g), ()),
                    )
                )
    last_rank = rank_of_stage[-1]
    probe = _probe(job, results[last_rank])
    if probe is None:  # not measured, or measured badly: no trace of it either
        traces = [replace(t, loss_change=()) for t in traces]
    all_losses = results[last_rank].losses
    loss = tuple(all_losses[job.warmup_steps :])
    device = results[0].device
    ranks = tuple(
        RankProfile(
            rank=r,
            actions=tuple(str(a) for a in executed[r]),
            composites=_composites(plan.composites[r], executed[r]),
            optimizer_ms=_stat(results[r].optimizer_ms),
        )
        for r in range(job.ranks)
    )
    extra: dict[str, Any] = {
        "profiler": "freezeopt.profile",
        "cost_clock": "cuda-events" if device.startswith("cuda") else "thread-cpu",
        "host": host,
        "data": results[0].data_provenance,
        "order_check": {"matches_schedule": not mismatches, "mismatches": mismatches},
        "group_costs": {
            "method": "leave-one-out on a captured microbatch: full backward (autograd.grad) or torch's W step",
            "stages": group_detail,
        },
        "lags": lag_detail,
        "train_loss_all_steps": list(all_losses),
        "val_loss_at_step": [0, job.warmup_steps + job.measure_steps]
        if results[last_rank].val_loss
        else [],
        "step_ms_samples": step_ms,
        "optimizer_wall_ms": {str(r.rank): statistics.median(r.optimizer_wall_ms) for r in results},
        "apf_alpha": APF_ALPHA,
        "stage_0_backward_in_w": any(a.stage == 0 and a.kind == "W" for a in all_actions),
    }
    if plan.csv_path is not None:
        extra["schedule_csv"] = Path(plan.csv_path).read_text()
    profile = Profile(
        schema_version=1,
        provenance=Provenance(
            source="measured",
            freezeopt=__version__,
            python=platform.python_version(),
            torch=torch_version(),
            device=device,
            job=job.to_dict(),
            job_sha256=job_sha256(job),
            seed=job.seed,
            steps_measured=n_steps,
        ),
        pipeline=Pipeline(
            schedule=plan.label,
            world_size=job.ranks,
            n_stages=plan.n_stages,
            n_microbatches=job.microbatches,
            microbatch_size=job.microbatch_size,
        ),
        ranks=ranks,
        actions=action_costs,
        stages=tuple(stages),
        lags=tuple(lags),
        gradients=tuple(traces),
        loss=loss,
        val_loss=results[last_rank].val_loss,
        step_ms=_stat(step_ms),
        extra=extra,
        timeline=tuple(timeline),
        probe=probe,
    )

    # self-check: the DAG's prediction from the measured costs versus the measured step time
    dag = build_dag(profile)
    predicted = simulate(dag).makespan
    wall_med = {a: statistics.median(walls[a]) for a in all_actions}
    predicted_wall = simulate(dag, wall_med).makespan
    measured = statistics.median(step_ms)
    err = (predicted - measured) / measured if measured > 0 else 0.0
    ratios = [
        w / c for a in all_actions for w, c in zip(walls[a], costs[a], strict=True) if c > 0.5
    ]
    inflation = statistics.median(ratios) if ratios else 1.0
    explanation = None
    if abs(err) > SELF_CHECK_TOLERANCE:
        explanation = _explain(err, inflation, job.ranks, host, predicted_wall, measured)
    extra["self_check"] = {
        "measured_step_ms": measured,
        "predicted_step_ms": predicted,
        "error": err,
        "predicted_from_wall_ms": predicted_wall,
        "wall_over_cost": inflation,
        "tolerance": SELF_CHECK_TOLERANCE,
        "explanation": explanation,
    }
    profile = replace(profile, extra=extra)

    summary: list[tuple[int, int, str, float, float, int]] = []
    for s in range(plan.n_stages):
        for kind in "FBIW":
            acts = [a for a in all_actions if a.stage == s and a.kind == kind]
            if acts:
                summary.append(
                    (
                        s,
                        rank_of_stage[s],
                        kind,
                        statistics.median(cost_med[a] for a in acts),
                        statistics.median(wall_med[a] for a in acts),
                        len(acts),
                    )
                )
    report = ProfileReport(
        loss_cost=loss_summary(profile),
        path=out,
        job=job.name,
        schedule=plan.label,
        world_size=job.ranks,
        n_stages=plan.n_stages,
        n_microbatches=job.microbatches,
        steps_measured=n_steps,
        device=device,
        measured_step_ms=measured,
        predicted_step_ms=predicted,
        error=err,
        explanation=explanation,
        action_ms=tuple(summary),
        group_ms=tuple(
            (st.stage, g.name, g.weight_grad_ms.median) for st in stages for g in st.groups
        ),
        lags_ms=tuple(
            (
                lg.src_stage,
                lg.dst_stage,
                lg.kind,
                lg.ms.median,
                lag_detail[f"{lg.src_stage}->{lg.dst_stage}"]["method"],
            )
            for lg in lags
        ),
        optimizer_ms=tuple(rp.optimizer_ms.median for rp in ranks if rp.optimizer_ms is not None),
        loss=loss,
        val_loss=results[last_rank].val_loss,
        order_ok=not mismatches,
        order_mismatches=tuple(mismatches),
        warnings=tuple(warnings),
        wall_s=wall_s,
    )
    return profile, report


def _explain(
    err: float,
    inflation: float,
    world: int,
    host: dict[str, Any],
    predicted_wall: float,
    measured: float,
) -> str:
    """Why the DAG's prediction misses the measured step time, most likely cause first."""
    cores = host.get("usable_cpus") or host.get("cpus") or 1
    wall_err = (predicted_wall - measured) / measured if measured > 0 else 0.0
    others = host.get("other_cpu_cores")
    reasons: list[str] = []
    if world > cores:
        reasons.append(
            f"{world} ranks share {cores} cores, so a rank that is ready often waits for a core "
            "(costs are CPU time, the step is wall time)"
        )
    if others is not None and others > OTHERS_BUSY:
        reasons.append(
            f"other processes kept {others:.2f} cores busy during the run (measure on a quiet machine)"
        )
    if inflation > 1.1:
        reasons.append(f"actions took {inflation:.2f}× longer in wall time than in CPU time")
    if err < 0:
        reasons.append(
            "the DAG leaves out time between actions (Python scheduling, posting sends and receives, "
            "waits inside torch's batched send/recv), which weighs more the shorter the actions"
        )
    else:
        reasons.append("measured lags or costs are pessimistic for this run")
    return (
        "; ".join(reasons)
        + f"; with wall-clock durations the DAG predicts {predicted_wall:.1f} ms ({wall_err * 100:+.1f} %)"
    )


def _lags(
    plan: PipelinePlan, run: _Run, results: Sequence[RankResult], same_host: bool
) -> tuple[list[Lag], dict[str, Any]]:
    """Cross-rank edge lags from the wall timeline, ping-pong where the timeline has too few samples."""
    sr = plan.stage_rank
    ping: dict[tuple[int, int], tuple[float, ...]] = {}
    for r in results:
        for (ra, rb), v in r.pingpong.items():
            ping[(ra, rb)] = v
            ping.setdefault((rb, ra), v)
    prev: list[dict[Action, Action | None]] = []
    for k in range(len(run.steps)):
        d: dict[Action, Action | None] = {}
        for order in run.orders[k]:
            for i, a in enumerate(order):
                d[a] = order[i - 1] if i > 0 else None
        prev.append(d)

    def ingrad(k: int, s: int, m: int) -> Action:
        b = Action(s, "B", m)
        return b if b in run.steps[k] else Action(s, "I", m)

    lags: list[Lag] = []
    detail: dict[str, Any] = {}
    n_mb = max((a.microbatch for st in run.steps for a in st), default=-1) + 1
    for s in range(plan.n_stages - 1):
        if sr[s] == sr[s + 1]:
            continue
        for kind, src, dst in (("F", s, s + 1), ("B", s + 1, s)):
            samples: list[float] = []
            if same_host:
                for k, st in enumerate(run.steps):
                    for m in range(n_mb):
                        prod = Action(s, "F", m) if kind == "F" else ingrad(k, s + 1, m)
                        cons = Action(s + 1, "F", m) if kind == "F" else ingrad(k, s, m)
                        if prod not in st or cons not in st:
                            continue
                        before = prev[k].get(cons)
                        if before is None or st[before][2] <= st[prod][2]:
                            samples.append((st[cons][1] - st[prod][2]) * 1e3)
            pp = ping.get((sr[src], sr[dst]), ())
            if len(samples) >= _MIN_LAG_SAMPLES:
                stat, method = _stat(samples), "timeline"
            elif pp:
                stat, method = _stat(pp), "ping-pong"
            else:
                continue
            lags.append(Lag(src_stage=src, dst_stage=dst, kind=kind, ms=stat))  # type: ignore[arg-type]
            detail[f"{src}->{dst}"] = {
                "kind": kind,
                "method": method,
                "timeline_samples": len(samples),
                "timeline_median_ms": statistics.median(samples) if samples else None,
                "pingpong_one_way_ms": statistics.median(pp) if pp else None,
            }
    return lags, detail


def _composites(
    runs: tuple[tuple[Action, ...], ...], executed: Sequence[Action]
) -> tuple[tuple[str, ...], ...]:
    """The plan's composites that ran as runs of consecutive actions (torch runs them so; an
    order that differed from the plan is reported under `order_check` and keeps only these)."""
    pos = {a: i for i, a in enumerate(executed)}
    return tuple(
        tuple(str(a) for a in run)
        for run in runs
        if all(a in pos for a in run)
        and [pos[a] for a in run] == list(range(pos[run[0]], pos[run[0]] + len(run)))
    )


def format_report(report: ProfileReport) -> str:
    """A short human-readable summary table of a profiling run."""
    lines = [
        f"{report.job} · {report.schedule} · {report.world_size} ranks · {report.n_stages} stages · "
        f"{report.n_microbatches} microbatches · {report.steps_measured} steps measured on {report.device} "
        f"({report.wall_s:.1f} s)",
        f"step time: measured {report.measured_step_ms:.1f} ms, DAG-predicted {report.predicted_step_ms:.1f} ms, "
        f"error {report.error * 100:+.1f} %",
    ]
    if report.explanation:
        lines.append(f"  why: {report.explanation}")
    lines.append("")
    lines.append(f"{'stage':>5} {'rank':>4} {'kind':>4} {'cost ms':>8} {'wall ms':>8} {'n':>3}")
    for st, rk, kind, cost, wall, n in report.action_ms:
        lines.append(f"{st:>5} {rk:>4} {kind:>4} {cost:>8.2f} {wall:>8.2f} {n:>3}")
    lines.append("")
    lines.append("weight-gradient cost per microbatch (ms):")
    by_stage: dict[int, list[str]] = {}
    for st, g, ms in report.group_ms:
        by_stage.setdefault(st, []).append(f"{g} {ms:.2f}")
    for st in sorted(by_stage):
        lines.append(f"  stage {st}: " + ", ".join(by_stage[st]))
    if report.lags_ms:
        lags = ", ".join(f"{s}→{d} {k} {ms:.3f} ({m})" for s, d, k, ms, m in report.lags_ms)
        lines.append(f"lags (ms): {lags}")
    lines.append(
        "optimizer step (ms): "
        + ", ".join(f"rank {r} {ms:.2f}" for r, ms in enumerate(report.optimizer_ms))
    )
    if report.loss:
        val = ""
        if report.val_loss:
            val = f"; validation {report.val_loss[0]:.3f} → {report.val_loss[-1]:.3f}"
        lines.append(
            f"loss {report.loss[0]:.3f} → {report.loss[-1]:.3f} over the measured steps{val}"
        )
    lc = report.loss_cost
    if lc is not None:
        r2 = lc["conservation_r2"]
        lines.append(
            f"loss cost: probe loss {lc['probe_loss'][0]:.3f} → {lc['probe_loss'][1]:.3f} over "
            f"{lc['steps']} steps; the groups' shares explain its changes"
            + (f" (R² {r2:.5f})" if r2 is not None else " (too few steps to say how well)")
        )
        br = lc.get("branch")
        if br is not None:
            lines.append(
                f"  branch runs ({br['steps']} steps, every group frozen in "
                f"{100 * br['frozen_share']:.0f} % of the microbatches): kept "
                f"{100 * br['kept']:.1f} % of the progress, the curves predicted "
                f"{100 * br['kept_predicted']:.1f} %"
            )
    if report.order_ok:
        lines.append("action order: every rank ran exactly the schedule's order")
    else:
        lines.append(
            "action order differs from the schedule: " + "; ".join(report.order_mismatches)
        )
    lines.extend(f"warning: {w}" for w in report.warnings)
    if report.path is not None:
        lines.append(f"profile written to {report.path}")
    return "\n".join(lines)
