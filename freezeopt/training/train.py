"""`freezeopt train`: train a job with its schedule replayed, and compare the time saved with the prediction.

Why: a schedule is only worth the time it saves in real training. `train_job` runs the job's
pipeline (the same ranks, stages, groups and optimizer `freezeopt profile` measured — both build it
through `freezeopt.torchpp.pipeline`) with the runtime controller (`freezeopt.training.runtime.FreezeController`)
skipping the frozen groups' weight-gradient work per microbatch (`freezeopt.training.rank` is the rank
side), watches the run, falls back to full updates on drift, checkpoints, and reports measured
against predicted step time.

Before any process starts, the schedule is checked against the job: the job's pipeline shape
(schedule kind, ranks, stages, microbatches, stage-to-rank map) is built from torch's schedule
classes and its parameter groups from the model on the meta device, with their fingerprints
(element count, shapes, dtypes), which must be the schedule's where it records them (a model of
another width has the same group names); any difference is a `MismatchError` naming it.

How the speed-up is measured: side by side in the same run. Steps that replay the
schedule ("freezing steps") are compared with the run's full-update steps — warm-up, periodic
full-update windows and fallbacks — which run the identical code with nothing frozen. Both sides
are medians of the barrier-to-last-rank step time (the profiler's definition: optimizer excluded),
leaving out the first `job.warmup_steps` steps of the run (torch's one-time setup). The predicted
side is the schedule's `prediction` (`baseline_ms` / `predicted_ms`). Use `--full-update-every`
to interleave full-update steps with freezing ones, so a change of machine load hits both alike.

Files in `out_dir`: `events.jsonl` (phase changes, drifts, rollbacks, checkpoints, resumes),
`metrics.jsonl` (per step: phase, loss, step time, optimizer time, gradient norm per group; and
validation losses), `actions.json` (the action timeline of a representative freezing step and
full-update step, for `freezeopt simulate --measured`), `report.json` (the `TrainReport`),
`schedule.yaml` (the schedule as the run replayed it, phase overrides applied), `checkpoints/` (see
`freezeopt.torchpp.checkpoint`), and with online re-planning `replans/step-NNNNNNNN.yaml`: each
re-plan's schedule file, named by the first step that runs it. With `opts.tracking` the finished
(or failed) run is logged from these files to MLflow and/or TensorBoard (`freezeopt.tracking`).

Online re-planning (`replan_every`, `replan_on_drift`; needs the schedule's `profile`): the run
re-solves from its own measured action costs, off the critical path, and every rank switches to
the new plan at the same step (`freezeopt.training.replan`, `freezeopt.training.rank`). Each re-plan is an event
with the old and new plan's step time predicted on the updated costs; the report counts them.
Without `resume` a run starts afresh and replaces these files; with it, it continues from the last
complete checkpoint (same job and schedule; `steps` is the step to train to).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from freezeopt.errors import (
    DivergedError,
    InputError,
    MismatchError,
    RankFailedError,
    option,
    short,
)
from freezeopt.fileio import atomic_write_text, check_output_folder
from freezeopt.formats.profile import load_profile, profile_sha256
from freezeopt.formats.schedule import (
    PipelineShape,
    Schedule,
    dump_schedule,
    load_schedule,
    pipeline_difference,
    schedule_sha256,
    with_phases,
)
from freezeopt.profiling.assemble import OTHERS_BUSY
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.torchpp.faults import parse_faults
from freezeopt.torchpp.job import Job, open_job
from freezeopt.torchpp.launch import (
    cpu_snapshot,
    host_info,
    in_torchrun,
    load_avg,
    other_cpu,
    run_ranks,
)
from freezeopt.torchpp.pipeline import (
    Fingerprints,
    Groups,
    PipelinePlan,
    plan_pipeline,
    preflight_model,
)
from freezeopt.torchpp.weights import pin_init
from freezeopt.tracking import track_run
from freezeopt.training.options import ReplanOptions, TrainOptions
from freezeopt.training.rank import RankTrainResult, TrainSpec, train_rank
from freezeopt.training.replan import ReplanSpec, check_profile_fits
from freezeopt.training.runlog import jsonable

__all__ = ["RunWarning", "TrainReport", "check_schedule_fits", "format_train_report", "train_job"]

COMPARISON = (
    "side by side in one run: freezing steps against the run's full-update steps (warm-up, "
    "full-update windows, fallbacks); medians of barrier-to-last-rank step time, optimizer excluded"
)
_RUN_FILES = ("events.jsonl", "metrics.jsonl", "actions.json", "report.json", "schedule.yaml")
_RUN_DIRS = ("checkpoints", "tensorboard", "replans")
"""An earlier run's files and folders (`tensorboard/`: what runs before `--tensorboard` wrote)."""
_NOT_TRAINING = (  # job fields that do not change the training trajectory (a resume may differ)
    "name",
    "warmup_steps",
    "measure_steps",
    "cost_samples",
    "lag_samples",
    "val_batches",
    "gradient_traces",
    "probe_batches",
    "branch_steps",
    "hang_timeout_s",
    "timeout_s",
)


class RunWarning(str):
    """A warning of a run: its text, and what it is about (`kind`) for a caller that acts on it —
    `replaced_run`, `no_freezing_step`, `no_full_update_step`, `busy_host`, or `other`."""

    kind: str

    def __new__(cls, text: str, kind: str = "other") -> RunWarning:
        w = super().__new__(cls, text)
        w.kind = kind
        return w


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainReport:
    """The summary of one training run (`to_dict` for `--json`; the files hold the detail)."""

    job: str
    schedule: str | None
    """The schedule file replayed (None: trained without freezing)."""
    pipeline: str
    """torch schedule name or `csv:<file>`."""
    world_size: int
    n_stages: int
    n_microbatches: int
    device: str
    start_step: int
    """First step run (after a resume: the checkpoint's step)."""
    end_step: int
    step_ms: float | None
    """Median measured step time of the freezing steps (without freezing steps: of all measured)."""
    full_step_ms: float | None
    """Median measured step time of the full-update steps (the no-freezing side)."""
    predicted_step_ms: float | None
    """The schedule's predicted step time."""
    predicted_baseline_ms: float | None
    """The schedule's predicted step time with nothing frozen."""
    saved_ms: float | None
    """full_step_ms − step_ms: the time freezing saved per step, measured."""
    predicted_saved_ms: float | None
    """predicted_baseline_ms − predicted_step_ms: the time the schedule should save per step."""
    measured_speedup: float | None
    """full_step_ms / step_ms."""
    predicted_speedup: float | None
    """predicted_baseline_ms / predicted_step_ms."""
    prediction_error: float | None
    """(step_ms − predicted_step_ms) / predicted_step_ms."""
    calibrated_predicted_ms: float | None
    """predicted_step_ms × full_step_ms / predicted_baseline_ms: the prediction scaled to this run."""
    freezing_steps: int
    """Freezing steps measured."""
    full_steps: int
    """Full-update steps measured."""
    comparison: str
    loss: float | None
    """Training loss of the last step."""
    val_loss: float | None
    """Validation loss at the end."""
    losses: tuple[tuple[int, float], ...]
    val_losses: tuple[tuple[int, float], ...]
    fallbacks: int
    """Drifts that made the controller fall back to full updates in this run."""
    rollbacks: int
    replans: int
    """Re-plans adopted during the run (online re-planning; 0 when off)."""
    replan_steps: tuple[int, ...]
    """The steps from which each adopted re-plan ran (the same on every rank, checked)."""
    events: tuple[dict[str, Any], ...]
    checkpoints: tuple[str, ...]
    actions: tuple[dict[str, Any], ...]
    """Per action: rank, frozen groups, median cost in full-update and in freezing steps (ms)."""
    out_dir: str
    warnings: tuple[RunWarning, ...]
    host: dict[str, Any]
    wall_s: float
    tracked: tuple[str, ...] = ()
    """Where the run was logged (MLflow run, TensorBoard folder); empty: nowhere."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return dict(jsonable(asdict(self)))


def train_job(
    job_path_or_spec: str | Path | Job,
    opts: TrainOptions,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> TrainReport:
    """Train `opts.steps` optimizer steps of the job, replaying `opts.schedule` (None: no
    freezing); `overrides` change job fields (as `freezeopt train --ranks …` does).

    The schedule's phases can be overridden (`opts.phases`); checkpoints are taken at phase
    boundaries, every `opts.checkpoints.every` steps and at the end, and `opts.checkpoints.resume`
    continues from the newest intact one; `opts.replan` re-solves online from the run's measured
    action costs. Raises MismatchError, before any process starts, when the schedule does not fit
    the job; RankFailedError when a rank crashes or hangs (the run can then continue with a
    resume)."""
    t_start = time.monotonic()
    job = open_job(job_path_or_spec, overrides)
    # a resume continues from its own checkpoint: the weights it started from stay the ones its
    # checkpoints record (the pretraining run may have moved on, or pruned them), and are not read
    recorded = _recorded_init(Path(opts.out_dir)) if opts.checkpoints.resume else None
    job = replace(job, init=recorded) if recorded and job.init else pin_init(job)
    if job.init is not None and Path(opts.out_dir).resolve() in Path(job.init).parents:
        raise InputError(
            f"init names a checkpoint of this run's own folder {opts.out_dir}; train into another "
            "--out-dir (or continue this run with --resume)"
        )
    ck = opts.checkpoints
    schedule = None
    if opts.schedule is not None:
        schedule = with_phases(
            load_schedule(opts.schedule),
            warmup_steps=opts.phases.warmup_steps,
            full_update_every=opts.phases.full_update_every,
        )
    plan = plan_pipeline(job)
    model = preflight_model(
        replace(job, init=None) if recorded else job, plan, in_torchrun=in_torchrun()
    )
    warnings: list[str] = []
    if schedule is not None:
        check_schedule_fits(
            schedule,
            job,
            plan,
            None if model is None else model.groups,
            source=str(opts.schedule),
            fingerprints=None if model is None else model.fingerprints,
        )
    replan = _replan_spec(schedule, opts.replan, warnings=warnings, for_gantt=opts.tracking.enabled)
    if replan is not None and replan.costs:
        _check_adaptive(replan, job, schedule, warnings)
    faults = parse_faults(opts.fault or "")
    for f in faults:
        if (
            f.kind in ("crash", "kill", "hang", "corrupt_checkpoint")
            and not 0 <= f.rank < job.ranks
        ):
            raise InputError(f"fault names rank {f.rank}, but the job has ranks 0..{job.ranks - 1}")
        if f.kind == "slow" and not 0 <= f.stage < plan.n_stages:
            raise InputError(f"fault names stage {f.stage}, but the job has {plan.n_stages} stages")
    out = Path(opts.out_dir)
    check_output_folder(out, "--out-dir")
    opts.tracking.check()
    meta = {
        "job": {k: v for k, v in job.to_dict().items() if k not in _NOT_TRAINING},
        "schedule_sha256": None if schedule is None else schedule_sha256(dump_schedule(schedule)),
        "rescale": opts.rescale,
    }
    start, resume_from = 0, None
    if ck.resume:
        skipped: list[dict[str, str]] = []
        good, corrupt = ckpt.resume_candidates(out / "checkpoints", range(job.ranks))
        newest_good = good[-1].step if good else -1
        for c, why in corrupt:
            if c.step > newest_good:
                warnings.append(f"checkpoint {c.path} skipped: {why}")
                skipped.append({"checkpoint": str(c.path), "reason": why})
        if not good:
            what = "intact" if corrupt else "complete"
            raise InputError(
                f"no {what} checkpoint under {out / 'checkpoints'}"
                + (f" ({corrupt[-1][1]})" if corrupt else "")
                + f"; run without {option('checkpoints.resume')} to start training"
            )
        last = good[-1]
        ckpt.check_meta(last, {**meta, "world_size": job.ranks})
        if last.step >= opts.steps:
            raise InputError(
                f"the last checkpoint ({last.path}) is at step {last.step}; pass {option('steps')} larger than "
                f"{last.step} to train further"
            )
        start, resume_from = last.step, str(last.path)
    else:
        earlier = _earlier_run(out)
        if earlier and not opts.overwrite:
            raise InputError(
                f"{out} holds an earlier run ({', '.join(earlier)}); pass "
                f"{option('checkpoints.resume')} to continue it, {option('overwrite')} to replace "
                f"it, or another {option('out_dir')}"
            )
        if (not in_torchrun() or int(os.environ["RANK"]) == 0) and _clear_run(out):
            warnings.append(
                RunWarning(
                    f"replaced the earlier run in {out}, its checkpoints too (--overwrite)",
                    "replaced_run",
                )
            )
    writes = not in_torchrun() or int(os.environ["RANK"]) == 0
    if writes and schedule is not None:
        atomic_write_text(out / "schedule.yaml", dump_schedule(schedule))
    spec = TrainSpec(
        job=job,
        plan=plan,
        schedule=schedule,
        options=opts,
        resume_from=resume_from,
        resume_skipped=tuple(skipped) if ck.resume else (),
        measure_from=start + job.warmup_steps,
        faults=faults,
        replan=replan,
        meta=meta,
    )
    host = host_info()
    before = cpu_snapshot()
    t_run = time.monotonic()
    try:
        results = run_ranks(
            job,
            functools.partial(train_rank, spec),
            total_units=opts.steps - start + 2,
            progress=opts.progress,
            verb="training",
            outcome=functools.partial(_resumable, out / "checkpoints"),
            log_prefix="train",
        )
    except RankFailedError:
        if writes and opts.tracking.enabled and _has_metrics(out):  # the steps it did run
            track_run(out, opts.tracking, status="FAILED", with_report=False, name=job.name)
        raise
    if not in_torchrun():
        host.update(other_cpu(before, cpu_snapshot(), time.monotonic() - t_run))
    host["load_avg_after"] = load_avg()
    report, actions_doc = _assemble(
        spec,
        results,
        schedule_path=None if opts.schedule is None else str(opts.schedule),
        host=host,
        warnings=warnings,
        wall_s=time.monotonic() - t_start,
    )
    if writes:
        atomic_write_text(out / "actions.json", json.dumps(actions_doc, indent=1) + "\n")
        atomic_write_text(out / "report.json", json.dumps(report.to_dict(), indent=1) + "\n")
        if opts.tracking.enabled:
            diverged = _diverged(report) is not None
            tracked = track_run(
                out,
                opts.tracking,
                profile=opts.replan.profile,
                status="FAILED" if diverged else "FINISHED",
                name=job.name,
            )
            report = replace(report, tracked=tuple(tracked.lines(opts.tracking)))
    diverged_error = _diverged(report)
    if diverged_error is not None:
        raise diverged_error
    return report


def _has_metrics(out: Path) -> bool:
    m = out / "metrics.jsonl"
    return m.is_file() and m.stat().st_size > 0


def _diverged(report: TrainReport) -> DivergedError | None:
    """The DivergedError to raise when the run ended on a non-finite loss (every update since
    was skipped: the run cannot recover by itself); None when it did not."""
    losses = report.losses
    if not losses or math.isfinite(losses[-1][1]):
        return None
    since = losses[-1][0]
    for step, loss in reversed(losses):
        if math.isfinite(loss):
            break
        since = step
    return DivergedError(
        f"the training loss was not finite from step {since} to the end (step {losses[-1][0]}: "
        f"{losses[-1][1]}); every update since was skipped and the run did not recover. Its files "
        f"are in {report.out_dir}; check the data and the learning rate"
    )


def check_schedule_fits(
    schedule: Schedule,
    job: Job,
    plan: PipelinePlan,
    groups: Groups | None,
    *,
    source: str,
    fingerprints: Fingerprints | None = None,
) -> None:
    """Raise MismatchError when `schedule` was made for another pipeline than `job`'s, or, given
    the job's group `fingerprints` and a schedule that records them, for another model."""
    shape = PipelineShape(
        schedule=plan.label,
        world_size=job.ranks,
        n_stages=plan.n_stages,
        n_microbatches=job.microbatches,
        stage_to_rank=tuple(plan.stage_rank),
        groups=None
        if groups is None
        else tuple(tuple(g for g, _ in groups[s]) for s in range(plan.n_stages)),
        fingerprints=None
        if fingerprints is None
        else tuple(fingerprints[s] for s in range(plan.n_stages)),
    )
    diff = pipeline_difference(schedule, shape)
    if diff is not None:
        what, a, b = diff
        raise MismatchError(
            f"schedule {source} does not fit job {job.name}: {what} is {short(a)} in the schedule but "
            f"{short(b)} in the job; profile and solve this job (`freezeopt profile` → `freezeopt solve`)"
        )


def format_train_report(report: TrainReport) -> str:
    """A short human-readable summary of a training run."""
    r = report
    lines = [
        f"{r.job} · {r.pipeline} · {r.world_size} ranks · {r.n_stages} stages · {r.n_microbatches} microbatches · "
        f"steps {r.start_step}→{r.end_step} on {r.device} ({r.wall_s:.1f} s)",
    ]
    if r.schedule is None:
        lines.append("no schedule: trained without freezing")
        lines.append(f"step time      measured {_ms(r.step_ms)} (median of {r.full_steps} steps)")
    else:
        lines.append(
            f"schedule {r.schedule}: {r.freezing_steps} freezing and {r.full_steps} full-update steps measured"
        )
        err = "" if r.prediction_error is None else f" ({r.prediction_error * 100:+.1f} %)"
        side = "freezing    " if r.freezing_steps else "(no freezing)"  # then: every measured step
        lines += [
            f"step time      measured {_ms(r.step_ms)} {side} predicted {_ms(r.predicted_step_ms)}{err}",
            f"no freezing    measured {_ms(r.full_step_ms)} full-update  predicted {_ms(r.predicted_baseline_ms)}",
            f"time saved     measured {_ms(r.saved_ms)} per step    predicted {_ms(r.predicted_saved_ms)}",
            f"speed-up       measured {_x(r.measured_speedup)}             predicted {_x(r.predicted_speedup)}",
        ]
    loss = "n/a" if r.loss is None else f"{r.loss:.4f}"
    val = "" if r.val_loss is None else f", validation {r.val_loss:.4f}"
    lines.append(f"loss           {loss} at the last step{val}")
    phases = sum(e["event"] == "phase" for e in r.events)
    ckpts = sum(e["event"] == "checkpoint" for e in r.events)
    lines.append(
        f"events         {phases} phase changes, {r.fallbacks} drifts (fallbacks), {r.rollbacks} rollbacks, "
        f"{ckpts} checkpoints, {r.replans} re-plans"
    )
    for e in r.events:
        if e["event"] in ("replan", "replan_rejected"):
            lines.append(
                f"  step {e['step']}: {e['event']} ({e['reason']}, triggered after step "
                f"{e['trigger_step']}): predicted {e['old_predicted_ms']:.1f} ms (old plan) → "
                f"{e['new_predicted_ms']:.1f} ms on the measured costs"
                + ("" if e["event"] == "replan" else f", kept the old plan ({e['why']})")
                + f"; {e['file']}"
            )
        elif e["event"] == "replan_failed":
            lines.append(f"  step {e['step']}: replan_failed ({e['error']})")
        elif e["event"] == "replan_skipped":
            lines.append(f"  step {e['step']}: replan_skipped ({e['reason']}: {e['why']})")
        elif e["event"] in ("drift", "rollback", "rollback_skipped"):
            detail = ", ".join(
                f"{k} {_said(v)}" for k, v in e.items() if k not in ("event", "step")
            )
            lines.append(f"  step {e['step']}: {e['event']} ({detail})")
    lines += [f"warning: {w}" for w in r.warnings]
    replans = any(e["event"] in ("replan", "replan_rejected") for e in r.events)
    lines.append(
        f"files in {r.out_dir}: report.json, events.jsonl, metrics.jsonl, actions.json, "
        + ("schedule.yaml, " if r.schedule is not None else "")
        + "checkpoints/"
        + (", replans/" if replans else "")
    )
    lines += [f"logged to {t}" for t in r.tracked]
    return "\n".join(lines)


# --- helpers ------------------------------------------------------------------------------------


def _replan_spec(
    schedule: Schedule | None, o: ReplanOptions, *, warnings: list[str], for_gantt: bool = False
) -> ReplanSpec | None:
    """Re-planning's inputs, read and checked against the schedule; None when re-planning is off
    (`TrainOptions` has checked that a schedule and a profile are given where it is on)."""
    if not o.on:
        if o.profile is not None and not for_gantt:  # tracking draws its Gantt chart from it
            warnings.append(
                "--profile is read only for online re-planning and the tracked Gantt chart; "
                "without --replan-every, --replan-on-drift, --adaptive, --mlflow or --tensorboard it "
                "was not used"
            )
        return None
    assert schedule is not None and o.profile is not None
    profile = load_profile(o.profile)
    check_profile_fits(schedule, profile, source=str(o.profile))
    sha = profile_sha256(profile)
    if sha != schedule.provenance.profile_sha256:
        warnings.append(
            f"the schedule was not solved from {o.profile}; re-plans use its costs and signal"
        )
    return ReplanSpec(
        profile=profile,
        profile_sha256=sha,
        every=o.every,
        on_drift=o.on_drift,
        mode=o.mode,
        time_limit=o.time_limit,
        costs=o.costs,
    )


def _check_adaptive(
    spec: ReplanSpec, job: Job, schedule: Schedule | None, warnings: list[str]
) -> None:
    """What `--adaptive` needs: a probe to measure (the job's probe batches), a profile whose
    groups have gradient traces (the `measured` sensitivity reads them), 2 microbatches or more;
    and full-update windows after warm-up, or it measures once."""
    if job.probe_batches < 1:
        raise InputError(
            f"{option('replan.costs')} measures the loss costs on the job's probe batches, and job "
            f"{job.name} has probe_batches: 0; set it to 1 or more"
        )
    prof = spec.profile
    traced = {(t.stage, t.group) for t in prof.gradients if t.step_sq_norms}
    untraced = [
        (st.stage, g.name)
        for st in prof.stages
        for g in st.groups
        if (st.stage, g.name) not in traced
    ]
    if untraced or prof.pipeline.n_microbatches < 2:
        why = (
            f"stage {untraced[0][0]} group {untraced[0][1]!r} has no gradient trace in the profile"
            if untraced
            else "the pipeline has fewer than 2 microbatches"
        )
        raise InputError(
            f"{option('replan.costs')} re-plans with the measured sensitivity, but {why}; "
            "profile the job with gradient_traces: true and 2 microbatches or more"
        )
    if schedule is not None and schedule.phases.full_update_every == 0:
        warnings.append(
            f"{option('replan.costs')} measures the loss costs in warm-up and full-update windows, "
            "and the schedule has no windows after warm-up (full_update_every 0): it re-plans once"
        )


def _resumable(root: Path) -> str:
    """How a stopped run goes on, as its checkpoints stand now (the end of a failure message)."""
    if ckpt.latest_checkpoint(root) is not None:
        return "the run can continue from its last checkpoint with --resume"
    return "it had written no checkpoint yet, so run it again without --resume"


def _recorded_init(out: Path) -> str | None:
    """The `init` checkpoint the newest checkpoint of the run in `out` records, if any."""
    newest = ckpt.latest_checkpoint(out / "checkpoints")
    job = newest.meta.get("job") if newest is not None else None
    init = job.get("init") if isinstance(job, dict) else None
    return init if isinstance(init, str) else None


def _earlier_run(out: Path) -> list[str]:
    """The files and folders of an earlier run in `out` (none: nothing would be lost)."""
    return [n for n in (*_RUN_FILES, *_RUN_DIRS) if os.path.lexists(out / n)]


def _clear_run(out: Path) -> bool:
    """A fresh run replaces an earlier run's files in `out` (and nothing else); whether there
    were checkpoints among them."""
    had_checkpoints = (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
    for name in _RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
    return had_checkpoints


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _assemble(
    spec: TrainSpec,
    results: Sequence[RankTrainResult],
    *,
    schedule_path: str | None,
    host: dict[str, Any],
    warnings: list[str],
    wall_s: float,
) -> tuple[TrainReport, dict[str, Any]]:
    job, plan, sched = spec.job, spec.plan, spec.schedule
    r0 = results[0]
    steps = list(r0.steps)
    end = steps[-1]["step"] + 1 if steps else spec.options.steps  # < steps after an early stop
    measured = [s for s in steps if s["step"] >= spec.measure_from]
    freeze = [s["step_ms"] for s in measured if s["freezing"]]
    full = [s["step_ms"] for s in measured if not s["freezing"]]
    freeze_ms, full_ms = _median(freeze), _median(full)
    warnings = [*warnings, *(w for r in results for w in r.warnings)]
    if sched is not None and not freeze:
        start = r0.start_step
        left_out = f"the job's first {job.warmup_steps} unmeasured" + (
            f" after the resume at step {start}" if start else ""
        )
        warnings.append(
            RunWarning(
                f"no freezing step was measured (warm-up {sched.phases.warmup_steps} steps; steps "
                f"before {spec.measure_from} left out, {left_out}); "
                + (
                    "train more --steps"
                    if start
                    else "pass a smaller --warmup-steps or more --steps"
                ),
                "no_freezing_step",
            )
        )
    if sched is not None and freeze and not full:
        warnings.append(
            RunWarning(
                "no full-update step was measured, so there is no measured speed-up; pass "
                f"--warmup-steps larger than the job's {job.warmup_steps} unmeasured steps, or "
                "--full-update-every",
                "no_full_update_step",
            )
        )
    others = host.get("other_cpu_cores")
    if others is not None and others > OTHERS_BUSY:
        warnings.append(
            RunWarning(
                f"other processes kept {others:.2f} cores busy during the run; step times are "
                "unreliable, measure on a quiet machine",
                "busy_host",
            )
        )
    pred = sched.prediction if sched is not None else None
    step_ms = freeze_ms if (sched is not None and freeze) else _median(freeze + full)
    costs = {a: d for r in results for a, d in r.costs.items()}
    frozen = {a: g for r in results for a, g in r.frozen_plan.items()}
    actions = tuple(
        {
            "action": str(a),
            "rank": r,
            "frozen": list(frozen.get(str(a), ())),
            "full_ms": _median(costs.get(str(a), {}).get("full", ())),
            "freeze_ms": _median(costs.get(str(a), {}).get("freeze", ())),
            "n_full": len(costs.get(str(a), {}).get("full", ())),
            "n_freeze": len(costs.get(str(a), {}).get("freeze", ())),
        }
        for r, acts in enumerate(plan.rank_actions)
        for a in acts
    )
    events = r0.events
    switches = [
        tuple(s["step"] for i, s in enumerate(r.steps) if i and s["plan"] != r.steps[i - 1]["plan"])
        for r in results
        if r.steps and "plan" in r.steps[0]
    ]
    if any(sw != switches[0] for sw in switches):  # a bug, not a user error
        raise RuntimeError(f"ranks switched plans at different steps: {switches}")
    losses = tuple((s["step"], s["loss"]) for s in steps)
    vals = r0.val_loss
    report = TrainReport(
        job=job.name,
        schedule=schedule_path,
        pipeline=plan.label,
        world_size=job.ranks,
        n_stages=plan.n_stages,
        n_microbatches=job.microbatches,
        device=r0.device,
        start_step=r0.start_step,
        end_step=end,
        step_ms=step_ms,
        full_step_ms=full_ms,
        predicted_step_ms=pred.predicted_ms if pred else None,
        predicted_baseline_ms=pred.baseline_ms if pred else None,
        saved_ms=full_ms - freeze_ms if (full_ms and freeze_ms and sched) else None,
        predicted_saved_ms=pred.baseline_ms - pred.predicted_ms if pred else None,
        measured_speedup=full_ms / freeze_ms if (full_ms and freeze_ms and sched) else None,
        predicted_speedup=pred.baseline_ms / pred.predicted_ms
        if pred and pred.predicted_ms
        else None,
        prediction_error=(freeze_ms - pred.predicted_ms) / pred.predicted_ms
        if pred and freeze_ms and pred.predicted_ms
        else None,
        calibrated_predicted_ms=pred.predicted_ms * full_ms / pred.baseline_ms
        if pred and full_ms and pred.baseline_ms
        else None,
        freezing_steps=len(freeze),
        full_steps=len(full),
        comparison=COMPARISON + f", steps before {spec.measure_from} left out",
        loss=losses[-1][1] if losses else None,
        val_loss=vals[-1][1] if vals and vals[-1][0] == end else None,
        losses=losses,
        val_losses=vals,
        fallbacks=sum(e["event"] == "drift" and e.get("response") != "replan" for e in events),
        rollbacks=sum(e["event"] == "rollback" for e in events),
        replans=sum(e["event"] == "replan" for e in events),
        replan_steps=switches[0] if switches else (),
        events=events,
        checkpoints=r0.checkpoints,
        actions=actions,
        out_dir=str(spec.options.out_dir),
        warnings=tuple(w if isinstance(w, RunWarning) else RunWarning(w) for w in warnings),
        host=host,
        wall_s=wall_s,
    )
    doc = {
        "format": "freezeopt-actions",
        "version": 1,
        "job": job.name,
        "schedule": plan.label,
        "schedule_file": schedule_path,
        "world_size": job.ranks,
        "n_stages": plan.n_stages,
        "n_microbatches": job.microbatches,
        "freeze": _timeline(results, "freeze"),
        "full": _timeline(results, "full"),
    }
    return report, dict(jsonable(doc))


def _timeline(results: Sequence[RankTrainResult], cls: str) -> dict[str, Any] | None:
    """The action timeline of the median-time step of class `cls` that every rank kept."""
    per_rank = [
        {st: (ms, acts, frozen) for st, ms, acts, frozen in r.timelines.get(cls, ())}
        for r in results
    ]
    common = sorted(set.intersection(*(set(d) for d in per_rank)) if per_rank else set())
    if not common:
        return None
    order = sorted(common, key=lambda st: (per_rank[0][st][0], st))
    step = order[(len(order) - 1) // 2]
    entries = []
    for r, d in zip(results, per_rank, strict=True):
        frozen = d[step][2]
        for action, t0, t1, cost in d[step][1]:
            entries.append(
                {
                    "action": action,
                    "rank": r.rank,
                    "start_ms": max(0.0, t0),
                    "end_ms": max(0.0, t1),
                    "cost_ms": cost,
                    "frozen": list(frozen.get(action, ())),
                }
            )
    entries.sort(key=lambda e: (e["start_ms"], e["rank"], e["action"]))
    return {"step": step, "step_ms": per_rank[0][step][0], "timeline": entries}


def _said(v: Any) -> str:
    """An event's value for people: floats to 4 significant digits, lists joined by `+`."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "+".join(_said(x) for x in v)
    return str(v)


def _ms(v: float | None) -> str:
    return "     n/a" if v is None else f"{v:8.1f} ms"


def _x(v: float | None) -> str:
    return "  n/a" if v is None else f"{v:.3f}×"
