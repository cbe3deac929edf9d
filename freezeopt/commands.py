"""File-to-file steps behind the CLI: read inputs, call the pure functions, write outputs.

Each function here is what one CLI command calls (`synth`, `solve`, `validate`; `simulate`'s is
`freezeopt.model.timelines.simulate_files`, which `compare` uses too). They own the side effects
(reading and writing files, timing) so that the DAG, the solver and the file formats stay pure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freezeopt.errors import InputError
from freezeopt.fileio import check_output_file
from freezeopt.formats.profile import Profile, load_profile, profile_sha256, save_profile
from freezeopt.formats.schedule import (
    Phases,
    Schedule,
    check_fits,
    check_phase_flags,
    load_schedule,
    save_schedule,
)
from freezeopt.model.dag import build_dag
from freezeopt.model.sensitivity import estimate_signal
from freezeopt.profiling.synth import SynthOptions, synth_profile
from freezeopt.solver import (
    SolveOptions,
    SolveResult,
    load_kernels,
    schedule_from_result,
    solve,
    solve_ttq,
)
from freezeopt.solver.pulp_run import model_paths

if TYPE_CHECKING:
    pass

__all__ = [
    "format_solve",
    "solve_file",
    "solve_summary",
    "synth_file",
    "validate_files",
]


def synth_file(opts: SynthOptions, out: Path) -> Profile:
    """Synthesise a profile and write it to `out`."""
    check_output_file(out, "-o")
    profile = synth_profile(opts)
    build_dag(profile)  # refuse to write a profile whose schedule is inconsistent
    save_profile(profile, out)
    return profile


def solve_file(
    profile_path: Path, opts: SolveOptions, *, phases: Phases, out: Path | None
) -> tuple[SolveResult, Schedule]:
    """Solve a profile; write the schedule to `out` when given."""
    check_phase_flags(phases.warmup_steps, phases.full_update_every)
    if out is not None:
        check_output_file(out, "-o", inputs=(Path(profile_path),))
    if opts.write_model is not None:
        for p in model_paths(opts.write_model):  # phase 1's file and phase 2's beside it
            check_output_file(p, "--write-model", inputs=(Path(profile_path),))
            if out is not None and os.path.realpath(p) == os.path.realpath(out):
                raise InputError(f"--write-model {p} is the schedule file (-o); name another file")
    profile = load_profile(profile_path)
    opts = opts.for_profile(measured=profile.probe is not None)
    dag = build_dag(profile)
    if opts.mode == "heuristic" or opts.fallback == "heuristic":
        # numba's compiled kernels load from their cache in about 0.5 s: before the solve's clock
        # starts, or a short --time-limit spends it on the relaxation's first iteration (at
        # 64×256 with 2 s: one iteration and 7.9 % from the LP optimum, against 300–440 and ~2 %)
        load_kernels()
    signal = estimate_signal(profile, opts.estimator)
    result = solve_ttq(dag, signal, opts) if opts.objective == "ttq" else solve(dag, signal, opts)
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


def solve_summary(
    r: SolveResult, out: Path | None, sched: Schedule | None = None
) -> dict[str, Any]:
    """What `freezeopt solve --json` prints (`sched`: the schedule written, for what was solved)."""
    how = {}
    if sched is not None:
        pv = sched.provenance
        how = {
            "objective": pv.objective,
            "sensitivity": pv.sensitivity,
            "budget_cap": pv.budget_cap,
        }
    return {
        **how,
        "status": r.status,
        "mode": r.mode,
        "solver": r.solver,
        "budget": r.budget,
        "baseline_ms": round(r.baseline_ms, 4),
        "all_frozen_ms": round(r.all_frozen_ms, 4),
        "lp_bound_ms": round(r.lp_bound_ms, 4),
        "bound_from_lp": r.bound_from_lp,
        "predicted_ms": round(r.predicted_ms, 4),
        "speedup": round(r.baseline_ms / r.predicted_ms, 4) if r.predicted_ms else None,
        "gap": round(r.gap, 6),
        "signal_dropped": round(r.signal_dropped, 6),
        "progress_ratio": round(r.progress_ratio, 6),
        "time_to_quality": None if r.time_to_quality is None else round(r.time_to_quality, 6),
        "frozen_actions": len({a for a, _ in r.frozen}),
        "solve_seconds": round(r.solve_seconds, 3),
        "schedule": str(out) if out else None,
        "notes": list(r.notes),
    }


def format_solve(r: SolveResult, out: Path | None, sched: Schedule | None = None) -> str:
    """What `freezeopt solve` prints for people (`sched`: the schedule written, for what was
    solved)."""
    gain = r.baseline_ms - r.predicted_ms
    room = r.baseline_ms - r.lp_bound_ms
    # without the LP the bound is the rank-load bound or the relaxation's (the notes say which)
    no_lp = not r.bound_from_lp
    what = "bound (no LP)" if no_lp else "LP bound"
    # a plan may freeze every action's work away (weight-gradient work alone, nothing else)
    speedup = (
        f"{r.baseline_ms / r.predicted_ms:.3f}x" if r.predicted_ms > 0 else "no step time left"
    )
    lines = []
    if sched is not None:
        pv = sched.provenance
        if pv.objective == "ttq":
            what_ = f"time to quality: the budget chosen up to the cap {pv.budget_cap:g}"
        else:
            what_ = f"shortest step under the budget {pv.budget:g}"
        lines.append(f"objective       {pv.objective} ({what_}; sensitivity {pv.sensitivity})")
    lines += [
        f"status          {r.status} ({r.mode}, {r.solver}, {r.solve_seconds:.2f} s)",
        f"no freezing     {r.baseline_ms:10.2f} ms",
        f"all frozen      {r.all_frozen_ms:10.2f} ms   (floor)",
        f"{what:<16}{r.lp_bound_ms:10.2f} ms   (budget {r.budget:g})",
        f"predicted       {r.predicted_ms:10.2f} ms   ({speedup}, "
        f"{100 * gain / room if room > 1e-12 else 100:.1f}% of the "
        f"{'bound' if no_lp else 'LP-bound'} gain, "
        f"gap {100 * r.gap:.2f}%)",
        f"signal dropped  {100 * r.signal_dropped:9.2f} %   (progress kept x{r.progress_ratio:.3f})",
        "time to quality "
        + (
            f"{r.time_to_quality:10.3f} x   (of not freezing's: step ratio / progress kept)"
            if r.time_to_quality is not None
            else "      none   (the plan keeps no progress)"
        ),
    ]
    lines += [f"note: {n}" for n in r.notes]
    lines.append(f"wrote {out}" if out else "no schedule written (pass -o FILE.yaml to write one)")
    return "\n".join(lines)


def validate_files(schedule_path: Path, profile_path: Path | None) -> tuple[Schedule, list[str]]:
    """Check a schedule file's schema and, with a profile, that it fits that job."""
    sched = load_schedule(schedule_path)
    warnings: list[str] = []
    if profile_path is not None:
        profile = load_profile(profile_path)
        warnings = check_fits(sched, profile, profile_sha256=profile_sha256(profile))
        build_dag(profile)
    return sched, warnings
