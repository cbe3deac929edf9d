"""A solve's answer as a schedule file: the plan in the file's compact form, with its provenance.

Why here and not beside the file format: the format (`freezeopt.formats.schedule`) is read by every
training rank and must not load the solver; only `solve` and the policies that compare against
it make schedules from results.
"""

from __future__ import annotations

from freezeopt import __version__
from freezeopt.errors import InputError
from freezeopt.formats.profile import Profile
from freezeopt.formats.schedule import (
    SCHEDULE_VERSION,
    Phases,
    Prediction,
    Realisation,
    Schedule,
    SchedulePipeline,
    ScheduleProvenance,
    format_microbatches,
    profile_fingerprints,
)
from freezeopt.model.dag import PipelineDag
from freezeopt.solver.problem import SolveOptions, SolveResult

__all__ = ["schedule_from_result"]


def schedule_from_result(
    result: SolveResult,
    *,
    profile: Profile,
    profile_sha256: str,
    dag: PipelineDag,
    opts: SolveOptions,
    phases: Phases,
    realisation: Realisation | None = None,
    label: str | None = None,
) -> Schedule:
    """The schedule file for a solve result (the groups' fingerprints copied from `profile`, where
    it has them for every group)."""
    frozen: dict[int, dict[str, list[int]]] = {}
    ratios: dict[int, dict[str, dict[int, float]]] = {}
    for (a, g), xv in result.frozen.items():
        name = dag.group_names[a.stage][g]
        r = round(xv, 4)
        if r >= 1.0:
            frozen.setdefault(a.stage, {}).setdefault(name, []).append(a.microbatch)
        elif r > 0:  # fractional freezing: `lp` mode only
            ratios.setdefault(a.stage, {}).setdefault(name, {})[a.microbatch] = r
    stage_to_rank = tuple(st.rank for st in profile.stages)
    objective = opts.objective
    if objective == "auto":
        raise InputError("objective 'auto' depends on the profile: resolve it (for_profile)")
    return Schedule(
        schema_version=SCHEDULE_VERSION,
        provenance=ScheduleProvenance(
            freezeopt=__version__,
            profile_sha256=profile_sha256,
            profile_source=profile.provenance.source,
            mode=label or result.mode,
            solver=result.solver,
            status=result.status,
            sensitivity=opts.sensitivity,
            budget=result.budget if objective == "ttq" else opts.budget,
            group_cap=opts.group_cap,
            stage_cap=opts.stage_cap,
            tolerance=opts.tolerance,
            objective=objective,
            budget_cap=opts.budget if objective == "ttq" else None,
        ),
        pipeline=SchedulePipeline(
            schedule=profile.pipeline.schedule,
            world_size=profile.pipeline.world_size,
            n_stages=profile.pipeline.n_stages,
            n_microbatches=profile.pipeline.n_microbatches,
            stage_to_rank=stage_to_rank,
            groups=dag.group_names,
            fingerprints=profile_fingerprints(profile),
        ),
        phases=phases,
        prediction=Prediction(
            baseline_ms=result.baseline_ms,
            all_frozen_ms=result.all_frozen_ms,
            lp_bound_ms=result.lp_bound_ms,
            predicted_ms=result.predicted_ms,
            gap=min(1.0, max(0.0, result.gap)),
            signal_dropped=min(1.0, max(0.0, result.signal_dropped)),
            progress_ratio=min(1.0, max(0.0, 1.0 - result.signal_dropped)),
            time_to_quality=result.time_to_quality,
            bound_from_lp=result.bound_from_lp,
        ),
        frozen={
            s: {
                name: format_microbatches(frozen[s][name])
                for name in dag.group_names[s]
                if name in frozen[s]
            }
            for s in sorted(frozen)
        },
        ratios={
            s: {
                name: dict(sorted(ratios[s][name].items()))
                for name in dag.group_names[s]
                if name in ratios[s]
            }
            for s in sorted(ratios)
        },
        realisation=realisation or Realisation(),
    )
