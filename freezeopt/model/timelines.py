"""A schedule's predicted timeline beside the no-freeze one and the steps as they ran in training.

`simulate_files` simulates a schedule on the profile it was solved for (the `simulate` command,
and `compare`'s Gantt charts); `load_action_log` reads the `actions.json` that `freezeopt train`
writes (the per-action wall timeline of one representative freezing step and one full-update
step), so what ran can be drawn beside what was predicted (`gantt_panels`, `freezeopt.model.plot`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freezeopt.actions import Action, parse_action
from freezeopt.errors import InputError, MismatchError
from freezeopt.fileio import check_output_file, read_text_file
from freezeopt.formats.profile import MAX_STEP_MS, load_profile, profile_sha256
from freezeopt.formats.schedule import check_fits, load_schedule
from freezeopt.model.dag import PipelineDag, build_dag, schedule_plan
from freezeopt.model.simulate import Timeline, simulate

if TYPE_CHECKING:
    from freezeopt.model.plot import GanttPanel

ACTION_LOG_MAX_BYTES = 64 * 2**20
"""An action log holds a few steps' timelines: far below this."""

__all__ = [
    "MeasuredStep",
    "SimulateReport",
    "format_simulate",
    "gantt_panels",
    "load_action_log",
    "simulate_files",
    "simulate_summary",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateReport:
    """A schedule's simulated timeline beside the no-freeze baseline."""

    dag: PipelineDag
    baseline: Timeline
    timeline: Timeline
    plan: dict
    warnings: tuple[str, ...]
    measured: tuple[MeasuredStep, ...] = ()
    """Measured steps from a training run's action log (freezing first), when one was given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredStep:
    """One step as it ran in training: wall start/end of every action (ms from the step's start)."""

    kind: str
    """`freeze` (a step replaying the schedule) or `full` (a full-update step)."""
    step: int
    timeline: Timeline
    frozen: dict[Action, tuple[str, ...]]
    """Group names each action skipped."""


def load_action_log(path: Path, dag: PipelineDag, *, schedule: str) -> tuple[MeasuredStep, ...]:
    """Read a training run's `actions.json`; raise when it is from another pipeline than `dag`'s."""
    if os.path.isdir(path):
        raise InputError(f"action log {path} is a folder; pass RUN_DIR/actions.json")
    text = read_text_file(
        Path(path),
        what="action log",
        limit=ACTION_LOG_MAX_BYTES,
        missing_hint="`freezeopt train` writes it as RUN_DIR/actions.json",
    )
    try:
        data = json.loads(text)
    except (RecursionError, ValueError) as e:
        raise InputError(f"cannot read action log {path}: {str(e)[:200]}") from None
    if not isinstance(data, dict) or data.get("format") != "freezeopt-actions":
        raise InputError(
            f"{path} is not a freezeopt action log (RUN_DIR/actions.json of `freezeopt train`)"
        )
    if data.get("version") != 1:
        raise InputError(
            f"{path}: action log version {data.get('version')!r} is not supported (1 is)"
        )
    got = (
        data.get("schedule"),
        data.get("world_size"),
        data.get("n_stages"),
        data.get("n_microbatches"),
    )
    want = (schedule, len(dag.rank_actions), dag.n_stages, dag.n_microbatches)
    if got != want:
        raise MismatchError(
            f"action log {path} is from a run of {got[0]} with {got[1]} ranks, {got[2]} stages and {got[3]} "
            f"microbatches, but the profile is {want[0]} with {want[1]}, {want[2]} and {want[3]}; "
            "give the run of this schedule's job"
        )
    out: list[MeasuredStep] = []
    for kind in ("freeze", "full"):
        sec = data.get(kind)
        if sec is None:
            continue
        try:
            start: dict[Action, float] = {}
            end: dict[Action, float] = {}
            frozen: dict[Action, tuple[str, ...]] = {}
            for entry in sec["timeline"]:
                a = parse_action(entry["action"])
                start[a], end[a] = float(entry["start_ms"]), float(entry["end_ms"])
                if not 0 <= start[a] <= end[a] <= MAX_STEP_MS:
                    raise ValueError(
                        f"{a} runs from {entry['start_ms']} to {entry['end_ms']} ms; times are "
                        "finite, non-negative (at most 1e18 ms), and an action ends after it starts"
                    )
                frozen[a] = tuple(entry.get("frozen", ()))
            step = int(sec["step"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # `1e999` reads as inf
            raise InputError(f"action log {path}: malformed {kind!r} section ({e})") from None
        missing = [str(a) for a in dag.order if a not in start]
        if missing or len(start) != len(dag.order):
            raise MismatchError(
                f"action log {path}: its {kind} step does not hold exactly the profile's actions "
                f"(e.g. {', '.join(missing[:3]) or 'extra ones'}); give the run of this schedule's job"
            )
        tl = Timeline(start=start, end=end, makespan=max(end.values()), critical_path=())
        out.append(MeasuredStep(kind=kind, step=step, timeline=tl, frozen=frozen))
    if not out:
        raise InputError(
            f"action log {path} holds no measured step; train longer (the first steps are not measured)"
        )
    return tuple(out)


def simulate_files(
    schedule_path: Path,
    profile_path: Path,
    *,
    gantt: Path | None = None,
    measured: Path | None = None,
) -> SimulateReport:
    """Simulate a schedule on the profile it was solved for; optionally save a Gantt chart.

    With `measured` (a training run's `actions.json`) the report and the chart also hold the
    steps as they ran.
    """
    if gantt is not None:
        inputs = (Path(schedule_path), Path(profile_path), *([Path(measured)] if measured else []))
        check_output_file(gantt, "--gantt", inputs=inputs)
    profile = load_profile(profile_path)
    sched = load_schedule(schedule_path)
    warnings = check_fits(sched, profile, profile_sha256=profile_sha256(profile))
    dag = build_dag(profile)
    plan = schedule_plan(sched, dag)
    report = SimulateReport(
        dag=dag,
        baseline=simulate(dag),
        timeline=simulate(dag, dag.durations(plan)),
        plan=plan,
        warnings=tuple(warnings),
        measured=()
        if measured is None
        else load_action_log(measured, dag, schedule=profile.pipeline.schedule),
    )
    if gantt is not None:
        _save_gantt(report, gantt)
    return report


def gantt_panels(
    report: SimulateReport, *, label: str = "schedule", baseline: bool = True
) -> list[GanttPanel]:
    """The Gantt panels of a simulation: the no-freeze prediction (unless `baseline` is False),
    the schedule's prediction (titled `label`), then each measured step."""
    from freezeopt.model.plot import GanttPanel

    dag = report.dag
    share: dict = {}
    for (a, g), x in report.plan.items():
        total = sum(dag.group_cost[a.stage])
        share[a] = share.get(a, 0.0) + x * dag.group_cost[a.stage][g] / total if total else 0.0
    panels = [GanttPanel("no freezing (predicted)", report.baseline, {})] if baseline else []
    panels.append(GanttPanel(f"{label} (predicted)", report.timeline, share))
    for m in report.measured:
        title = "freezing step" if m.kind == "freeze" else "full-update step"
        panels.append(
            GanttPanel(f"measured {title} {m.step}", m.timeline, _frozen_share(dag, m.frozen))
        )
    return panels


def _save_gantt(report: SimulateReport, path: Path) -> None:
    from freezeopt.fileio import atomic_write_bytes
    from freezeopt.model.plot import gantt_figure

    fig = gantt_figure(report.dag, gantt_panels(report))
    import io

    buf = io.BytesIO()
    fmt = path.suffix.lstrip(".").lower() or "png"
    if fmt not in ("png", "svg", "pdf"):
        raise InputError(f"--gantt {path}: use a .png, .svg or .pdf file name")
    fig.savefig(buf, format=fmt, dpi=120, metadata={"Software": None} if fmt == "png" else None)
    atomic_write_bytes(path, buf.getvalue())


def _frozen_share(dag: PipelineDag, frozen: dict[Action, tuple[str, ...]]) -> dict[Action, float]:
    """Per action, the share of its stage's weight-gradient cost it skipped: whole groups (`name`)
    or k of a group's n tensors (`name[k/n]`, counted as k/n of the group's cost)."""
    out: dict[Action, float] = {}
    for a, labels in frozen.items():
        costs, names = dag.group_cost[a.stage], dag.group_names[a.stage]
        total = sum(costs)
        skipped = 0.0
        for label in labels:
            name, _, part = label.partition("[")
            if name not in names:
                continue
            k, _, n = part.rstrip("]").partition("/")
            frac = int(k) / int(n) if part and n.isdigit() and k.isdigit() and int(n) else 1.0
            skipped += costs[names.index(name)] * frac
        if skipped > 0 and total > 0:
            out[a] = skipped / total
    return out


def simulate_summary(rep: SimulateReport, gantt: Path | None) -> dict[str, Any]:
    """What `freezeopt simulate --json` prints."""
    tl, base = rep.timeline, rep.baseline
    return {
        "baseline_ms": round(base.makespan, 4),
        "predicted_ms": round(tl.makespan, 4),
        "speedup": round(base.makespan / tl.makespan, 4) if tl.makespan else None,
        "critical_path": [str(a) for a in tl.critical_path],
        "frozen_actions": len({a for a, _ in rep.plan}),
        "gantt": str(gantt) if gantt else None,
        "measured": {
            m.kind: {"step": m.step, "step_ms": round(m.timeline.makespan, 4)} for m in rep.measured
        },
    }


def _speedup(baseline_ms: float, ms: float) -> str:
    """`1.234x`, or what a step of 0 ms is (every action's work frozen away): no ratio."""
    return f"{baseline_ms / ms:.3f}x" if ms > 0 else "no step time left"


def format_simulate(rep: SimulateReport, gantt: Path | None) -> str:
    """What `freezeopt simulate` prints for people."""
    tl, base = rep.timeline, rep.baseline
    path = [str(a) for a in tl.critical_path]
    lines = [
        f"no freezing  {base.makespan:10.2f} ms",
        f"schedule     {tl.makespan:10.2f} ms   ({_speedup(base.makespan, tl.makespan)})",
    ]
    for m in rep.measured:
        what = "freezing step" if m.kind == "freeze" else "full-update step"
        lines.append(f"measured     {m.timeline.makespan:10.2f} ms   ({what} {m.step})")
    lines.append(f"critical path ({len(path)} actions): {' '.join(path)}")
    if gantt:
        lines.append(f"wrote {gantt}")
    return "\n".join(lines)
