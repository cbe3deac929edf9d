"""`freezeopt compare`: every freezing policy on the same real job, side by side, with a report.

One profile, then for each policy (`freezeopt.compare.policies`) a schedule file and real training runs
with the same runtime, job, seed and data order. Each repeat trains `none` first, for `steps` (N)
steps: its final validation loss is that repeat's target. The other policies follow, in an order
rotated from one repeat to the next so slow drift of the machine falls on all of them alike; each
may train up to `overrun`·N steps and stops at the first validation from step N on once its
validation loss has reached the target (`TrainOptions(stop_at_val_loss=…, stop_from=N)`).
Validation runs every `val_every` steps and at step N.

So accuracy is compared like for like, at the same N steps — the validation loss at step N, the
mean train loss of the 10 steps before it, the median step time of steps `warmup_steps`..N−1 —
and time to accuracy is defined for policies that end a little worse at N: the training seconds
(sum of measured step times; optimizer and validation excluded) until the validation loss reached
the target (linearly interpolated between the validation before and the first at or below it), and its ratio to `none`'s own time to that loss in the same repeat; "never" when
a policy does not get there within `overrun`·N steps.

The report (`report.md`, `results.json`, PNG plots) gives per policy medians over the repeats: the
measured step time and its ratio to `none` (per repeat, with the min–max spread), the predicted
step time, the share of the LP-bound gain captured ((none − measured) / (none − LP bound), the
prediction scaled to the run's own no-freezing speed), the signal dropped, train and validation
loss at N and the time to `none`'s validation loss; plus loss-against-time curves, Gantt charts
predicted against measured for `none` and `freezeopt`, and a budget sweep (step time against
validation loss at N, one curve per budgeted policy, `timelyfreeze-matched` among them).
`results.json` also records how the comparison was run (command, start, duration, load average).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from freezeopt.compare.policies import BUDGETED, MATCH_TOLERANCE, POLICIES, Policy, policy_schedule
from freezeopt.errors import FreezeoptError, InputError, option
from freezeopt.fileio import atomic_write_bytes, atomic_write_text, check_output_folder
from freezeopt.formats.profile import load_profile
from freezeopt.formats.schedule import Drift, Phases, check_phase_flags, save_schedule
from freezeopt.torchpp.job import Job, open_job
from freezeopt.tracking import TrackingOptions, track_compare

__all__ = [
    "GANTT_POLICIES",
    "CompareOptions",
    "CompareReport",
    "PolicyResult",
    "Run",
    "compare_job",
    "format_compare",
    "format_report",
    "format_run_info",
    "load_compare",
]

GANTT_POLICIES: tuple[Policy, ...] = ("none", "freezeopt")
"""Policies whose report gets a Gantt chart, predicted against measured."""
TAIL = 10
"""Train loss: the mean of this many steps before step N."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareOptions:
    """What to compare and how long."""

    policies: tuple[Policy, ...] = (
        "none",
        "uniform",
        "timelyfreeze",
        "timelyfreeze-matched",
        "stability",
        "freezeopt",
    )
    steps: int = 120
    """N: optimizer steps of `none`, and the step at which every policy's accuracy is compared."""
    warmup_steps: int = 10
    """Full-update steps at the start of every run (not counted in step times)."""
    budget: float = 0.1
    repeats: int = 1
    val_every: int = 20
    """Validation every this many steps (and at step N)."""
    overrun: float = 1.5
    """Freezing policies may train up to overrun·N steps to reach `none`'s validation loss."""
    sweep: tuple[float, ...] = ()
    """Budgets for the sweep (each: one N-step run per policy that has a budget)."""
    seed: int = 0
    time_limit: float = 60.0

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One training run, as measured."""

    policy: str
    budget: float
    repeat: int
    step_ms: float
    """Median step time of steps warmup..N−1."""
    loss: float
    """Mean train loss of the 10 steps before step N."""
    val_loss: float
    """Validation loss at step N."""
    curve: tuple[tuple[float, float], ...]
    """(seconds of training, validation loss) at each validation point."""
    loss_curve: tuple[tuple[float, float], ...]
    """(seconds of training, train loss) per step."""
    out_dir: str
    end_step: int = 0
    """Where the run ended: N for `none` and sweep runs, up to `max_steps` for the others."""
    max_steps: int = 0
    target: float | None = None
    """The validation loss the run was measured against: its repeat's `none` final one."""
    time_to_target_s: float | None = None
    """Training seconds until the validation loss reached `target`, interpolated between the
    validations around it (None: never)."""
    steps_to_target: int | None = None
    wall_s: float = 0.0
    """Wall-clock seconds of the whole run (start-up, validation and checkpoints included)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyResult:
    """A policy's figures (medians over repeats)."""

    policy: str
    step_ms: float
    ratio: float
    """Median over repeats of step_ms / the same repeat's `none` step_ms."""
    predicted_ms: float
    predicted_ratio: float
    lp_bound_ms: float
    gain_captured: float | None
    """(none − measured) / (none − LP bound), prediction scaled to this machine's no-freeze speed."""
    signal_dropped: float
    loss: float
    val_loss: float
    """Validation loss at step N."""
    time_to_target_s: float | None
    """Training seconds to reach the `none` run's final validation loss (None: never)."""
    ratio_min: float | None = None
    ratio_max: float | None = None
    time_ratio: float | None = None
    """Median over repeats of time_to_target / `none`'s own time to that loss (None: never)."""
    reached: int = 0
    """Repeats in which the policy reached `none`'s final validation loss."""
    repeats: int = 1
    max_steps: int = 0
    stage_cap: float | None = None
    """`timelyfreeze` policies: the per-stage mean freeze-ratio cap used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareReport:
    job: str
    out_dir: str
    options: dict[str, Any]
    results: tuple[PolicyResult, ...]
    runs: tuple[Run, ...]
    sweep: tuple[Run, ...] = field(default=())
    warnings: tuple[str, ...] = ()
    run_info: dict[str, Any] = field(default_factory=dict)
    """How the comparison was run: command, started (UTC), wall_s, load averages, cpu_count."""
    figures: tuple[str, ...] = ()
    """The PNG files of the report, in its folder."""
    unreliable: tuple[str, ...] = ()
    """The runs during which other processes kept the host's cores busy: their step times, and
    every ratio to `none`, are not to be trusted (empty: none was)."""
    tracked: tuple[str, ...] = ()
    """Where the comparison was logged (MLflow run, TensorBoard folder); empty: nowhere."""


def compare_job(
    job: str | Path | Job,
    *,
    out_dir: Path,
    opts: CompareOptions,
    progress: bool = True,
    command: str | None = None,
    tracking: TrackingOptions | None = None,
) -> CompareReport:
    """Profile `job` once, then train it under each policy; write the report into `out_dir`.

    `command` (how the comparison was started) goes into `results.json` with its start, duration
    and the machine's load average. With `tracking`, the finished comparison is logged (a parent
    run with a child per trained run; `freezeopt.tracking.track_compare`).
    """
    from freezeopt.profiling.run import profile_job
    from freezeopt.training.options import (
        CheckpointOptions,
        PhaseOverrides,
        ReplanOptions,
        TrainOptions,
    )
    from freezeopt.training.train import train_job

    check_output_folder(Path(out_dir), "-o")
    if tracking is not None:
        tracking.check()
    job_obj = open_job(job)
    if job_obj.val_batches < 1:
        raise InputError(
            f"job {job_obj.name} has no validation batches (val_batches: 0); the comparison needs a "
            "validation loss, set val_batches"
        )
    t0, started, load0 = time.monotonic(), _now(), _load()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof_path = out_dir / "profile.json"
    profile_job(job, out=prof_path, progress=progress)
    profile = load_profile(prof_path)
    # Each policy is replayed as planned: the drift rules that fall back to full updates are set out
    # of reach (non-finite values still stop an update), since a fallback window would mix the
    # policies and the step-time rule fires on a busy machine's noise. `fallbacks` is still reported.
    off = Drift(loss_rise=1e6, grad_norm_spike=1e6, step_time_error=1e6)
    phases = Phases(warmup_steps=opts.warmup_steps, full_update_every=0, drift=off)
    n = opts.steps
    longest = max(n, math.ceil(opts.overrun * n - 1e-9))

    predicted: dict[tuple[str, float], Any] = {}
    caps: dict[tuple[str, float], float | None] = {}
    paths: dict[tuple[str, float], Path] = {}
    warnings: list[str] = []
    busy: list[str] = []  # runs during which other processes loaded the host

    def schedule_for(policy: Policy, budget: float) -> Path:
        if (policy, budget) not in paths:
            sched, res = policy_schedule(
                profile,
                policy,
                budget=budget,
                phases=phases,
                seed=opts.seed,
                time_limit=opts.time_limit,
                total_steps=opts.steps,
            )
            predicted[(policy, budget)] = res
            caps[(policy, budget)] = sched.provenance.stage_cap
            path = out_dir / "schedules" / f"{policy}-b{budget:g}.yaml"
            save_schedule(sched, path)
            paths[(policy, budget)] = path
        return paths[(policy, budget)]

    def run(
        policy: Policy, budget: float, repeat: int, tag: str, *, steps: int, target: float | None
    ) -> Run:
        sched = schedule_for(policy, budget)
        rdir = out_dir / "runs" / f"{tag}-{policy}-b{budget:g}-r{repeat}"
        adaptive = policy == "freezeopt-adaptive"  # its windows are its schedule's
        run_opts = TrainOptions(
            steps=steps,
            out_dir=rdir,
            schedule=sched,
            phases=PhaseOverrides(
                warmup_steps=opts.warmup_steps, full_update_every=None if adaptive else 0
            ),
            replan=ReplanOptions(profile=prof_path, costs=True) if adaptive else ReplanOptions(),
            checkpoints=CheckpointOptions(keep=1),
            val_every=opts.val_every,
            overwrite=True,  # a comparison written again replaces its own runs
            progress=progress,
            stop_at_val_loss=None if steps == n else target,
            stop_from=n,
        )
        rep = train_job(job, run_opts)
        empty = not predicted[(policy, budget)].frozen  # no freezing steps, as planned
        if any(w.kind == "busy_host" for w in rep.warnings):
            busy.append(rdir.name)
        warnings.extend(
            f"{rdir.name}: {w}"
            for w in rep.warnings
            if not (empty and w.kind == "no_freezing_step")
            # a run's own speed-up (against its full-update steps) is not used here: each policy
            # is timed against `none`'s run, and the hint names train's options; and a report
            # written again replaces its own runs: not worth a warning
            and w.kind not in ("no_full_update_step", "replaced_run")
        )
        return _read_run(
            rdir,
            policy=policy,
            budget=budget,
            repeat=repeat,
            warmup=opts.warmup_steps,
            n=n,
            max_steps=steps,
            target=target,
        )

    others: list[Policy] = [p for p in opts.policies if p != "none"]
    runs: list[Run] = []
    for r in range(opts.repeats):
        ref = run("none", opts.budget, r, "main", steps=n, target=None)
        runs.append(ref)
        k = r % len(others) if others else 0
        for policy in others[k:] + others[:k]:
            runs.append(run(policy, opts.budget, r, "main", steps=longest, target=ref.val_loss))
    target0 = runs[0].val_loss
    sweep: list[Run] = []
    for b in opts.sweep:
        if b == opts.budget:
            continue  # the main runs are that point
        for swept in (p for p in opts.policies if p in BUDGETED):
            sweep.append(run(swept, b, 0, "sweep", steps=n, target=target0))

    results = _aggregate(runs, predicted, caps, opts)
    run_info = {
        "command": command,
        "started": started,
        "wall_s": round(time.monotonic() - t0, 1),
        "load_avg_start": load0,
        "load_avg_end": _load(),
        "cpu_count": os.cpu_count(),
    }
    report = CompareReport(
        job=job_obj.name,
        out_dir=str(out_dir),
        options=asdict(opts),
        results=results,
        runs=tuple(runs),
        sweep=tuple(sweep),
        warnings=tuple(dict.fromkeys(warnings)),
        run_info=run_info,
        unreliable=tuple(busy),
    )
    figures = _write_figures(report, out_dir, prof_path, paths)
    report = dataclasses.replace(report, figures=figures)
    atomic_write_text(
        out_dir / "results.json", json.dumps(asdict(report), indent=1, default=str) + "\n"
    )
    atomic_write_text(out_dir / "report.md", format_report(report) + "\n")
    if tracking is not None and tracking.enabled:
        tracked = track_compare(out_dir, tracking)
        report = dataclasses.replace(report, tracked=tuple(tracked.lines(tracking)))
    return report


def load_compare(out_dir: Path) -> CompareReport:
    """Read back the `results.json` a comparison wrote."""
    path = Path(out_dir) / "results.json"
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path} not found; run `freezeopt compare` into {out_dir} first"
        ) from None
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {path}: {e}") from None

    if not isinstance(d, dict) or "overrun" not in d.get("options", {}):
        raise InputError(
            f"{path} was written by an earlier `freezeopt compare` (no overrun, no run record); "
            "run the comparison again"
        )

    def run(r: dict[str, Any]) -> Run:
        return Run(
            **{
                **r,
                "curve": tuple(map(tuple, r["curve"])),
                "loss_curve": tuple(map(tuple, r["loss_curve"])),
            }
        )

    try:
        return CompareReport(
            job=d["job"],
            out_dir=d["out_dir"],
            options=d["options"],
            results=tuple(PolicyResult(**r) for r in d["results"]),
            runs=tuple(run(r) for r in d["runs"]),
            sweep=tuple(run(r) for r in d["sweep"]),
            warnings=tuple(d.get("warnings", ())),
            run_info=dict(d.get("run_info", {})),
            figures=tuple(d.get("figures", ())),
            unreliable=tuple(d.get("unreliable", ())),
        )
    except (KeyError, TypeError) as e:
        raise InputError(f"{path} is not a freezeopt compare result ({e})") from None


def _check(opts: CompareOptions) -> None:
    """Refuse values out of range: an `InputError` naming the field."""
    bad = [p for p in opts.policies if p not in POLICIES]
    if bad:
        raise InputError(f"unknown policy {bad[0]!r}; use {', '.join(POLICIES)}")
    if "none" not in opts.policies:
        raise InputError(
            f"the comparison needs the `none` policy as its reference; add it to {option('policies')}"
        )
    if len(set(opts.policies)) != len(opts.policies):
        raise InputError(f"{option('policies')} names a policy twice; name each once")
    check_phase_flags(opts.warmup_steps, None)
    if opts.steps <= opts.warmup_steps + 5:
        raise InputError(
            f"{option('steps')} must exceed the warm-up ({opts.warmup_steps}) by more than 5"
        )
    if opts.repeats < 1:
        raise InputError(f"{option('repeats')} must be at least 1")
    if opts.val_every < 1:
        raise InputError(
            f"{option('val_every')} must be at least 1 (the comparison needs validation losses)"
        )
    if not (math.isfinite(opts.overrun) and 1.0 <= opts.overrun <= 100.0):
        raise InputError(f"{option('overrun')} must be between 1 and 100 (got {opts.overrun:g})")
    for b in (opts.budget, *opts.sweep):
        if not 0.0 <= b <= 1.0:
            raise InputError(f"budget {b:g} is outside [0, 1]; budgets are shares of the signal")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _read_run(
    rdir: Path,
    *,
    policy: str,
    budget: float,
    repeat: int,
    warmup: int,
    n: int,
    max_steps: int,
    target: float | None,
) -> Run:
    metrics = [
        json.loads(line)
        for line in (rdir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    report = json.loads((rdir / "report.json").read_text())
    metrics = [m for m in metrics if "step_ms" in m]  # validation records carry only val_loss
    times, t = [], 0.0
    by_step: dict[int, float] = {}
    for m in metrics:  # an adaptive run's probe passes are part of its time
        t += (m["step_ms"] + m.get("probe_ms", 0.0)) / 1000.0
        by_step[int(m["step"])] = t
        times.append((t, float(m["loss"])))
    measured = [m["step_ms"] for m in metrics if warmup <= int(m["step"]) < n]
    vals = [(int(s), float(v)) for s, v in report.get("val_losses", [])]
    at_n = [v for s, v in vals if s == n]
    if not measured or not at_n:
        raise FreezeoptError(
            f"run {rdir} holds no step time or no validation loss at step {n}; its report.json and "
            "metrics.jsonl are incomplete"
        )
    curve = tuple((by_step.get(s - 1, 0.0) if s > 0 else 0.0, v) for s, v in vals)
    goal = at_n[0] if target is None else target
    i = next((i for i, (_, v) in enumerate(curve) if v <= goal), None)
    tail = [float(m["loss"]) for m in metrics if n - TAIL <= int(m["step"]) < n]
    return Run(
        policy=policy,
        budget=budget,
        repeat=repeat,
        step_ms=statistics.median(measured),
        loss=statistics.fmean(tail),
        val_loss=at_n[0],
        curve=curve,
        loss_curve=tuple(times),
        out_dir=str(rdir),
        end_step=int(report["end_step"]),
        max_steps=max_steps,
        target=goal,
        time_to_target_s=None if i is None else crossing(curve, i, goal),
        steps_to_target=None if i is None else vals[i][0],
        wall_s=float(report.get("wall_s", 0.0)),
    )


def crossing(curve: tuple[tuple[float, float], ...], i: int, goal: float) -> float:
    """Training seconds at which the validation loss reached `goal`, `curve[i]` being the first
    validation at or below it: interpolated linearly from the validation before it, so the time
    is not rounded up to the next validation (with validation every 10 of 300 steps, 3 %)."""
    t1, v1 = curve[i]
    if i == 0:
        return t1
    t0, v0 = curve[i - 1]
    return t0 + (t1 - t0) * (v0 - goal) / (v0 - v1) if v0 > v1 else t1


def _median_or_none(xs: list[float]) -> float | None:
    m = statistics.median(xs) if xs else math.inf
    return m if math.isfinite(m) else None


def _aggregate(
    runs: list[Run],
    predicted: dict[tuple[str, float], Any],
    caps: dict[tuple[str, float], float | None],
    opts: CompareOptions,
) -> tuple[PolicyResult, ...]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.policy, []).append(r)
    ref = {r.repeat: r for r in by["none"]}
    none_ms = statistics.median(r.step_ms for r in by["none"])
    base_pred = predicted[("none", opts.budget)].predicted_ms
    scale = none_ms / base_pred if base_pred else 1.0  # the DAG's ms on this machine's clock
    out = []
    for policy in opts.policies:
        rs = sorted(by[policy], key=lambda r: r.repeat)
        pred = predicted[(policy, opts.budget)]
        ms = statistics.median(r.step_ms for r in rs)
        ratios = [r.step_ms / ref[r.repeat].step_ms for r in rs]
        lp_ms = pred.lp_bound_ms * scale
        room = none_ms - lp_ms
        inf = math.inf
        times = [inf if r.time_to_target_s is None else r.time_to_target_s for r in rs]
        own = [ref[r.repeat].time_to_target_s for r in rs]
        t_ratios = [
            t / o if o and math.isfinite(t) else inf for t, o in zip(times, own, strict=True)
        ]
        out.append(
            PolicyResult(
                policy=policy,
                step_ms=ms,
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
                predicted_ms=pred.predicted_ms,
                predicted_ratio=pred.predicted_ms / base_pred if base_pred else 1.0,
                lp_bound_ms=pred.lp_bound_ms,
                gain_captured=(none_ms - ms) / room if policy != "none" and room > 1e-9 else None,
                signal_dropped=pred.signal_dropped,
                loss=statistics.median(r.loss for r in rs),
                val_loss=statistics.median(r.val_loss for r in rs),
                time_to_target_s=_median_or_none(times),
                time_ratio=_median_or_none(t_ratios),
                reached=sum(math.isfinite(t) for t in times),
                repeats=len(rs),
                max_steps=max(r.max_steps for r in rs),
                stage_cap=caps.get((policy, opts.budget)),
            )
        )
    return tuple(out)


def format_compare(rep: CompareReport) -> str:
    """The results table as Markdown, with the notes that explain it."""
    none = next(r for r in rep.results if r.policy == "none")
    n = int(rep.options.get("steps", 0))
    lines = []
    if rep.unreliable:
        lines += [
            f"**UNRELIABLE**: other processes kept the host busy during {len(rep.unreliable)} of "
            f"{len(rep.runs) + len(rep.sweep)} runs ({', '.join(rep.unreliable[:4])}"
            + (", …" if len(rep.unreliable) > 4 else "")
            + "): their step times, and every ratio below, are not to be trusted; run again on a "
            "quiet machine.",
            "",
        ]
    lines += [
        f"| policy | step ms (measured) | × none (min–max) | predicted ms | × none (predicted) | "
        f"LP-bound gain captured | signal dropped | train loss at {n} | val loss at {n} | "
        "time to none's val loss | × none's time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rep.results:
        gain = "—" if r.gain_captured is None else f"{100 * r.gain_captured:.0f} %"
        ratio = f"{r.ratio:.3f}"
        if r.repeats > 1 and r.ratio_min is not None and r.ratio_max is not None:
            ratio += f" ({r.ratio_min:.3f}–{r.ratio_max:.3f})"
        of = f" ({r.reached}/{r.repeats})" if r.repeats > 1 else ""
        if r.time_to_target_s is None:
            reach = f"never within {r.max_steps} steps{of}"
        else:
            reach = f"{r.time_to_target_s:.1f} s{of}"
        t_ratio = "—" if r.time_ratio is None else f"{r.time_ratio:.3f}"
        lines.append(
            f"| {r.policy} | {r.step_ms:.1f} | {ratio} | {r.predicted_ms:.1f} | "
            f"{r.predicted_ratio:.3f} | {gain} | {100 * r.signal_dropped:.1f} % | {r.loss:.3f} | "
            f"{r.val_loss:.3f} | {reach} | {t_ratio} |"
        )
    reps = none.repeats
    lines += [
        "",
        f"Reference: `none` at {none.step_ms:.1f} ms per step, validation loss {none.val_loss:.3f} "
        f"at step {n}" + (f" (medians of {reps} repeats)." if reps > 1 else "."),
    ]
    budget = float(rep.options.get("budget", 0.0))
    for r in rep.results:
        if r.stage_cap is not None:
            what = "TimelyFreeze's default"
            if r.policy == "timelyfreeze-matched":
                what = "chosen so its plan drops the budget's share of the signal"
                if r.stage_cap >= 1.0 and r.signal_dropped < budget * (1 - MATCH_TOLERANCE):
                    what = (
                        f"the highest; even there its plan drops less than the budget, {budget:g}"
                    )
            lines.append(
                f"`{r.policy}`: per-stage mean freeze-ratio cap {r.stage_cap:.3f} ({what}); "
                f"signal dropped {100 * r.signal_dropped:.1f} %."
            )
    return "\n".join(lines)


def format_report(rep: CompareReport) -> str:
    """The whole `report.md`."""
    o, info = rep.options, rep.run_info
    n = int(o.get("steps", 0))
    md = [f"# freezeopt compare: {rep.job}", ""]
    if info:
        md += [format_run_info(info), ""]
    md += [
        f"Options: `{json.dumps(rep.options, sort_keys=True)}`",
        "",
        f"Each repeat trains `none` for {n} steps first; its validation loss at step {n} is the "
        f"target. The other policies may train up to {o.get('overrun', 1.0):g}×{n} steps and stop at "
        f"the first validation from step {n} on once they have reached it (validation every "
        f"{o.get('val_every')} steps and at step {n}). Step times, train and validation loss are "
        f"compared at step {n}; time to `none`'s validation loss is training seconds (sum of "
        "measured step times) until the validation loss reached the target (interpolated between "
        "the validations around it). Ratios to `none` "
        "are taken per repeat; the table gives medians over repeats (min–max of the step-time "
        "ratio; reached: repeats in which the target was reached).",
        "",
        format_compare(rep),
    ]
    if rep.warnings:
        md += ["", "Warnings from the runs:", ""] + [f"- {w}" for w in rep.warnings]
    captions = {
        "loss_vs_time.png": "loss against training time",
        "budget_sweep.png": "budget sweep",
    }
    for fig in rep.figures:
        cap = captions.get(fig)
        if cap is None:
            cap = f"{fig[len('gantt-') : -len('.png')]}: predicted against measured"
        md += ["", f"![{cap}]({fig})"]
    return "\n".join(md)


def format_run_info(info: dict[str, Any]) -> str:
    """One line: how a comparison was run (command, start, duration, cores, load average)."""
    cmd = f"`{info['command']}`" if info.get("command") else "run"
    wall = info.get("wall_s")
    load0, load1 = info.get("load_avg_start"), info.get("load_avg_end")
    parts = [f"started {info.get('started', '?')}"]
    if wall is not None:
        parts.append(f"{float(wall) / 60:.1f} min")
    if info.get("cpu_count"):
        parts.append(f"{info['cpu_count']} cores")
    if load0 and load1:
        parts.append(f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    return f"{cmd}: " + ", ".join(parts) + "."


def _write_figures(
    rep: CompareReport, out_dir: Path, prof_path: Path, paths: dict[tuple[str, float], Path]
) -> tuple[str, ...]:
    figs: dict[str, Any] = {"loss_vs_time.png": _loss_figure(rep)}
    budget = float(rep.options["budget"])
    for policy in GANTT_POLICIES:
        run = next((r for r in rep.runs if r.policy == policy and r.repeat == 0), None)
        if run is not None:
            figs[f"gantt-{policy}.png"] = _gantt_figure(
                policy, paths[(policy, budget)], prof_path, Path(run.out_dir)
            )
    if rep.sweep:
        figs["budget_sweep.png"] = _sweep_figure(rep)
    for name, fig in figs.items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
        atomic_write_bytes(out_dir / name, buf.getvalue())
    return tuple(figs)


def _gantt_figure(policy: str, schedule: Path, prof_path: Path, run_dir: Path) -> Any:
    """Predicted (the profile's clock) above measured (the run's median freezing step and its
    median full-update step) for one policy's run."""
    from freezeopt.model.plot import gantt_figure
    from freezeopt.model.timelines import gantt_panels, simulate_files

    sim = simulate_files(schedule, prof_path, measured=run_dir / "actions.json")
    panels = gantt_panels(sim, label=policy, baseline=policy != "none")
    return gantt_figure(sim.dag, panels)


def _loss_figure(rep: CompareReport) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for run in rep.runs:
        if run.repeat:
            continue
        xs = [t for t, _ in run.loss_curve]
        ys = _smooth([v for _, v in run.loss_curve])
        (line,) = ax.plot(xs, ys, lw=1, alpha=0.6, label=f"{run.policy} (train)")
        if run.curve:
            ax.plot(
                [t for t, _ in run.curve],
                [v for _, v in run.curve],
                "o-",
                color=line.get_color(),
                lw=1.5,
                label=f"{run.policy} (val)",
            )
    target = next((r.val_loss for r in rep.runs if r.policy == "none" and r.repeat == 0), None)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1, label="none's final val loss (target)")
    ax.set_xlabel("training time (s, sum of step times)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, ncols=2)
    ax.grid(alpha=0.3)
    return fig


def _sweep_figure(rep: CompareReport) -> Any:
    """Step time against validation loss at N: per budgeted policy one curve over the budgets
    (the main budget's point is the median of its repeats), the others one point each."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    budget = float(rep.options["budget"])
    points: dict[str, list[tuple[float, float, float]]] = {}
    for res in rep.results:
        points.setdefault(res.policy, []).append((budget, res.step_ms, res.val_loss))
    for r in rep.sweep:
        points.setdefault(r.policy, []).append((r.budget, r.step_ms, r.val_loss))
    for policy, pts in points.items():
        pts.sort()
        if policy in BUDGETED:
            ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", label=policy)
            for b, x, y in pts:
                ax.annotate(f"{b:g}", (x, y), fontsize=6)
        else:
            ax.plot([p[1] for p in pts], [p[2] for p in pts], "s", label=policy)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel(f"validation loss at step {rep.options.get('steps')}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _smooth(xs: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out
