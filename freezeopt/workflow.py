"""File-to-file steps behind the CLI: read inputs, call the pure functions, write outputs.

Each function here is what one CLI command calls. They own the side effects (reading and
writing files, timing) so that `dag`, `solve`, `simulate` and `schedule` stay pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freezeopt.dag import PipelineDag, build_dag
from freezeopt.errors import InputError
from freezeopt.profile_file import Profile, load_profile, profile_sha256, save_profile
from freezeopt.schedule import (
    Phases,
    Schedule,
    check_fits,
    load_schedule,
    save_schedule,
    schedule_from_result,
    schedule_plan,
)
from freezeopt.sensitivity import estimate_signal
from freezeopt.simulate import Timeline, simulate
from freezeopt.solve import SolveOptions, SolveResult, solve
from freezeopt.synth import SynthOptions, synth_profile

__all__ = ["SimulateReport", "simulate_files", "solve_file", "synth_file", "validate_files"]


def synth_file(opts: SynthOptions, out: Path) -> Profile:
    """Synthesise a profile and write it to `out`."""
    profile = synth_profile(opts)
    build_dag(profile)  # refuse to write a profile whose schedule is inconsistent
    save_profile(profile, out)
    return profile


def solve_file(
    profile_path: Path, opts: SolveOptions, *, phases: Phases, out: Path | None
) -> tuple[SolveResult, Schedule]:
    """Solve a profile; write the schedule to `out` when given."""
    profile = load_profile(profile_path)
    dag = build_dag(profile)
    result = solve(dag, estimate_signal(profile, opts.sensitivity), opts)
    sched = schedule_from_result(
        result,
        profile=profile,
        profile_sha256=profile_sha256(profile),
        dag=dag,
        opts=opts,
        phases=phases,
    )
    if out is not None:
        save_schedule(sched, out)
    return result, sched


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateReport:
    """A schedule's simulated timeline beside the no-freeze baseline."""

    dag: PipelineDag
    baseline: Timeline
    timeline: Timeline
    plan: dict
    warnings: tuple[str, ...]


def simulate_files(
    schedule_path: Path, profile_path: Path, *, gantt: Path | None = None
) -> SimulateReport:
    """Simulate a schedule on the profile it was solved for; optionally save a Gantt chart."""
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
    )
    if gantt is not None:
        _save_gantt(report, gantt)
    return report


def _save_gantt(report: SimulateReport, path: Path) -> None:
    from freezeopt.fileio import atomic_write_bytes
    from freezeopt.plot import GanttPanel, gantt_figure

    dag = report.dag
    share: dict = {}
    for (a, g), x in report.plan.items():
        total = sum(dag.group_cost[a.stage])
        share[a] = share.get(a, 0.0) + x * dag.group_cost[a.stage][g] / total if total else 0.0
    fig = gantt_figure(
        dag,
        [
            GanttPanel("no freezing", report.baseline, {}),
            GanttPanel("schedule", report.timeline, share),
        ],
    )
    import io

    buf = io.BytesIO()
    fmt = path.suffix.lstrip(".").lower() or "png"
    if fmt not in ("png", "svg", "pdf"):
        raise InputError(f"--gantt {path}: use a .png, .svg or .pdf file name")
    fig.savefig(buf, format=fmt, dpi=120, metadata={"Software": None} if fmt == "png" else None)
    atomic_write_bytes(path, buf.getvalue())


def validate_files(schedule_path: Path, profile_path: Path | None) -> tuple[Schedule, list[str]]:
    """Check a schedule file's schema and, with a profile, that it fits that job."""
    sched = load_schedule(schedule_path)
    warnings: list[str] = []
    if profile_path is not None:
        profile = load_profile(profile_path)
        warnings = check_fits(sched, profile, profile_sha256=profile_sha256(profile))
        build_dag(profile)
    return sched, warnings
