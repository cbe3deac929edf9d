"""The `freezeopt` command line: parse, call one library function, print.

Data goes to stdout (`--json` for machines), logs and progress to stderr. A user error prints one
line on stderr and exits with the code in `freezeopt.errors.EXIT_CODES`, never a traceback.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from freezeopt import __version__
from freezeopt.errors import EXIT_CODES, FreezeoptError

__all__ = ["DEFAULT_STORE", "FLAGS", "INTERRUPTED", "app", "one_line"]

app = typer.Typer(
    name="freezeopt",
    help="Freeze the right parameters at the right time to speed up pipeline-parallel training.\n\n"
    "Workflow: `freezeopt profile` (or `synth`) → `freezeopt solve` → commit the schedule → train.\n\n"
    "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=False,
)
F = TypeVar("F", bound=Callable[..., Any])


# Arguments and options several commands share, declared once.
JobArg = Annotated[str, typer.Argument(help="Job spec (YAML) or a built-in job name (tiny-gpt).")]
RanksOpt = Annotated[int | None, typer.Option(help="Override the number of ranks.")]
StagesPerRankOpt = Annotated[int | None, typer.Option(help="Override stages per rank.")]
MicrobatchesOpt = Annotated[int | None, typer.Option(help="Override microbatches per step.")]
BatchSizeOpt = Annotated[
    int | None, typer.Option(help="Override the batch size (samples per step).")
]
DeviceOpt = Annotated[str | None, typer.Option(help="Override the device: cpu or cuda.")]
SeedOpt = Annotated[int | None, typer.Option(help="Override the seed.")]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="No progress bar on stderr.")]
DEFAULT_STORE = "default"
"""What a bare `--mlflow` stands for: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."""
MlflowOpt = Annotated[
    str | None,
    typer.Option(
        metavar="[URI]",
        help="Log to MLflow at this tracking URI (alone: $MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db). Needs freezeopt[mlflow].",
    ),
]
TensorboardOpt = Annotated[
    Path | None,
    typer.Option(
        help="Log to TensorBoard: event files in a sub-folder of this folder. Needs "
        "freezeopt[tensorboard]."
    ),
]


def _tracking(mlflow: str | None, tensorboard: Path | None) -> Any:
    """The tracking options the flags ask for."""
    from freezeopt.tracking import TrackingOptions, default_mlflow_uri

    uri = default_mlflow_uri() if mlflow == DEFAULT_STORE else mlflow
    return TrackingOptions(mlflow=uri, tensorboard=tensorboard)


def _overrides(**given: Any) -> dict[str, Any] | None:
    """The job fields a command overrides: those given on the command line."""
    out = {k: v for k, v in given.items() if v is not None}
    return out or None


INTERRUPTED = "error: interrupted (Ctrl-C)"
"""What Ctrl-C outside a run of ranks prints (`freezeopt.torchpp.launch` adds that every rank stopped)."""


FLAGS = {
    # SolveOptions
    "budget": "--budget",
    "group_cap": "--group-cap",
    "stage_cap": "--stage-cap",
    "tolerance": "--tolerance",
    "time_limit": "--time-limit",
    "gap": "--gap",
    "threads": "--threads",
    # phases (solve, train, compare)
    "warmup_steps": "--warmup-steps",
    "full_update_every": "--full-update-every",
    # TrainOptions and its configs
    "steps": "--steps",
    "schedule": "--schedule",
    "val_every": "--val-every",
    "stop_at_val_loss": "stop_at_val_loss",
    "stop_from": "stop_from",
    "checkpoints.resume": "--resume",
    "overwrite": "--overwrite",
    "out_dir": "--out-dir",
    "checkpoints.keep": "--keep-checkpoints",
    "checkpoints.every": "--checkpoint-every",
    "replan.profile": "--profile",
    "replan.every": "--replan-every",
    "replan.on_drift": "--replan-on-drift",
    "replan.mode": "--replan-mode",
    "replan.time_limit": "--replan-time-limit",
    "replan.costs": "--adaptive",
    "tracking.mlflow": "--mlflow",
    "tracking.tensorboard": "--tensorboard",
    # CompareOptions
    "policies": "--policies",
    "repeats": "--repeats",
    "overrun": "--overrun",
    # SynthOptions
    "ranks": "--ranks",
    "stages_per_rank": "--stages-per-rank",
    "microbatches": "--microbatches",
    "microbatch_size": "--microbatch-size",
    "groups": "--groups",
    "forward_ms": "--forward-ms",
    "backward_ms": "--backward-ms",
    "weight_share": "--weight-share",
    "jitter": "--jitter",
    "noise": "--noise",
    "last_stage_factor": "--last-stage-factor",
    "lag_ms": "--lag-ms",
    "trace_steps": "--trace-steps",
}
"""The options' field names, as the library's errors name them, and the flag each comes from here
(two have no flag: they are library options only)."""


def one_line(text: str) -> str:
    """A message on one line, whatever a path or a field in it holds (newlines shown as \\n)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _friendly(fn: F) -> F:
    """Turn FreezeoptError into one stderr line (options named by their flags) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FreezeoptError as e:
            typer.echo(f"error: {one_line(e.said(FLAGS))}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED, err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"freezeopt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """freezeopt."""


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


@app.command()
@_friendly
def profile(
    job: JobArg,
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="Profile to write (default: profiles/<job name>.json)."),
    ] = None,
    schedule: Annotated[
        str | None, typer.Option(help="Override the job's schedule (torch name or CSV file).")
    ] = None,
    ranks: RanksOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
    microbatches: MicrobatchesOpt = None,
    batch_size: BatchSizeOpt = None,
    steps: Annotated[
        int | None, typer.Option(help="Override the number of measured steps.")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Override the number of warm-up steps.")
    ] = None,
    device: DeviceOpt = None,
    seed: SeedOpt = None,
    no_progress: NoProgressOpt = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON object.")
    ] = False,
) -> None:
    """Run a real pipelined training job, measure it, and write its profile.

    Spawns the ranks itself (gloo on CPU, nccl on CUDA), or joins torchrun's when RANK and
    WORLD_SIZE are set; rank 0 writes the file. User code named in the job spec runs, as with any
    training script; profile and schedule files are data only.

    Example: freezeopt profile tiny-gpt -o out/tiny-gpt.json
    """
    from freezeopt.errors import InputError
    from freezeopt.profiling.run import format_report, profile_job

    given = dict(
        schedule=schedule, ranks=ranks, stages_per_rank=stages_per_rank,
        microbatches=microbatches, batch_size=batch_size, measure_steps=steps,
        warmup_steps=warmup, device=device, seed=seed,
    )  # fmt: skip
    for flag, v in (("--steps", steps), ("--warmup", warmup)):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be at least 1 (got {v})")
    target = out if out is not None else Path("profiles") / f"{_job_name(job)}.json"
    report = profile_job(job, out=target, progress=not no_progress, overrides=_overrides(**given))
    if as_json:
        _print_json(report.to_dict())
    else:
        typer.echo(format_report(report))


@app.command()
@_friendly
def train(
    job: JobArg,
    steps: Annotated[int, typer.Option(help="Train until this optimizer step.")],
    schedule: Annotated[
        Path | None,
        typer.Option(help="Schedule file to replay (from `freezeopt solve`); none: no freezing."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="Run folder: events, metrics, checkpoints (default: runs/<job name>)."),
    ] = None,
    warmup_steps: Annotated[
        int | None, typer.Option(help="Override the schedule's full-update warm-up steps.")
    ] = None,
    full_update_every: Annotated[
        int | None,
        typer.Option(help="Override the schedule's full-update window period (0: never)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in the run folder.")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace an earlier run in the run folder (without it, or --resume, a folder "
            "holding one is refused: nothing is deleted).",
        ),
    ] = False,
    rollback: Annotated[
        bool, typer.Option("--rollback", help="On drift, also restore the last checkpoint.")
    ] = False,
    no_rescale: Annotated[
        bool,
        typer.Option(
            "--no-rescale", help="Do not rescale partly frozen groups' gradients by M/(M−k)."
        ),
    ] = False,
    keep_checkpoints: Annotated[int, typer.Option(help="Complete checkpoints to keep.")] = 3,
    checkpoint_every: Annotated[
        int,
        typer.Option(
            help="Also checkpoint every N steps (0: only at phase boundaries and the end)."
        ),
    ] = 0,
    val_every: Annotated[
        int, typer.Option(help="Validation loss every N steps (0: only at the end).")
    ] = 0,
    pipeline: Annotated[
        str | None,
        typer.Option(help="Override the job's pipeline schedule (torch name or CSV file)."),
    ] = None,
    ranks: RanksOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
    microbatches: MicrobatchesOpt = None,
    batch_size: BatchSizeOpt = None,
    device: DeviceOpt = None,
    seed: SeedOpt = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="The profile the schedule was solved from (to re-plan; tracked runs get a Gantt "
            "chart from it)."
        ),
    ] = None,
    replan_every: Annotated[
        int,
        typer.Option(help="Re-plan from measured action costs after every N steps (0: never)."),
    ] = 0,
    replan_on_drift: Annotated[
        bool,
        typer.Option(
            "--replan-on-drift",
            help="Re-plan when the step-time drift rule fires (instead of falling back).",
        ),
    ] = False,
    replan_mode: Annotated[
        str, typer.Option(help="Solve mode of re-plans: heuristic, lp or milp.")
    ] = "heuristic",
    replan_time_limit: Annotated[
        float, typer.Option(help="Seconds for one re-plan's solve.")
    ] = 10.0,
    adaptive: Annotated[
        bool,
        typer.Option(
            "--adaptive",
            help="Adaptive freezing: measure what freezing costs in loss in warm-up and every "
            "full-update window, and re-plan by time to quality from it (needs --profile).",
        ),
    ] = False,
    fault: Annotated[
        str | None,
        typer.Option(hidden=True, help="Test-only injected fault (see freezeopt.torchpp.faults)."),
    ] = None,
    mlflow: MlflowOpt = None,
    tensorboard: TensorboardOpt = None,
    no_progress: NoProgressOpt = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object.")
    ] = False,
) -> None:
    """Train a job with a schedule replayed; report measured against predicted step time.

    The schedule must fit the job (same schedule kind, ranks, stages, microbatches and parameter
    groups) or nothing starts. Freezing steps are timed side by side with the run's full-update
    steps (warm-up, full-update windows), so the measured speed-up needs some of both.

    Job fields can be overridden as for `freezeopt profile` (the pipeline schedule is --pipeline
    here, since --schedule names the freezing schedule): train the job you profiled.

    With --replan-every N and/or --replan-on-drift (and --profile), the run re-plans online from
    its own measured action costs: rank 0 solves in the background, every rank switches to the new
    plan at the same step; each re-plan is an event and a schedule file in RUN/replans/.

    With --mlflow and/or --tensorboard the ended run is logged from its files (also a failed one);
    `freezeopt track RUN` logs a run folder later.

    Example: freezeopt train tiny-gpt --schedule schedules/tiny-gpt-1f1b.yaml --steps 60 --warmup-steps 10
    """
    from freezeopt.training.options import (
        CheckpointOptions,
        PhaseOverrides,
        ReplanOptions,
        TrainOptions,
    )
    from freezeopt.training.train import format_train_report, train_job

    opts = TrainOptions(
        steps=steps,
        out_dir=out_dir if out_dir is not None else Path("runs") / _job_name(job),
        schedule=schedule,
        phases=PhaseOverrides(warmup_steps=warmup_steps, full_update_every=full_update_every),
        checkpoints=CheckpointOptions(
            resume=resume, rollback=rollback, keep=keep_checkpoints, every=checkpoint_every
        ),
        replan=ReplanOptions(
            profile=profile,
            every=replan_every,
            on_drift=replan_on_drift,
            mode=replan_mode,  # type: ignore[arg-type]
            time_limit=replan_time_limit,
            costs=adaptive,
        ),
        tracking=_tracking(mlflow, tensorboard),
        rescale=not no_rescale,
        val_every=val_every,
        overwrite=overwrite,
        progress=not no_progress,
        fault=fault,
    )
    overrides = _overrides(
        schedule=pipeline, ranks=ranks, stages_per_rank=stages_per_rank,
        microbatches=microbatches, batch_size=batch_size, device=device, seed=seed,
    )  # fmt: skip
    report = train_job(job, opts, overrides=overrides)
    if as_json:
        _print_json(report.to_dict())
    else:
        typer.echo(format_train_report(report))


@app.command()
@_friendly
def compare(
    job: JobArg,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: none, uniform, timelyfreeze, timelyfreeze-matched, stability, "
            "freezeopt, freezeopt-heuristic, freezeopt-ttq, freezeopt-adaptive, autofreeze, composer."
        ),
    ] = "none,uniform,timelyfreeze,timelyfreeze-matched,stability,freezeopt",
    steps: Annotated[
        int,
        typer.Option(help="Steps of the `none` run: N, where every policy's accuracy is compared."),
    ] = 120,
    warmup_steps: Annotated[
        int, typer.Option(help="Full-update steps at the start of each run.")
    ] = 10,
    budget: Annotated[float, typer.Option(help="Budget of the policies that take one.")] = 0.1,
    repeats: Annotated[
        int, typer.Option(help="Runs per policy; `none` first, the others rotated each repeat.")
    ] = 1,
    val_every: Annotated[int, typer.Option(help="Validation loss every this many steps.")] = 20,
    overrun: Annotated[
        float,
        typer.Option(
            help="Freezing policies may train up to this × --steps to reach none's validation loss."
        ),
    ] = 1.5,
    sweep: Annotated[
        str, typer.Option(help="Comma-separated budgets for the budget sweep (empty: none).")
    ] = "",
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="Report folder (default: reports/<job name>)."),
    ] = None,
    mlflow: MlflowOpt = None,
    tensorboard: TensorboardOpt = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bars.")] = False,
) -> None:
    """Train the job under each freezing policy and write a side-by-side report.

    Profiles once, solves a schedule per policy (matched budgets), trains each for real with the
    same runtime, seed and data, and writes report.md, results.json and PNG plots. `none` runs
    --steps (N) steps; the others run until they reach its final validation loss, at most
    --overrun × N steps, and are compared with it at step N.

    Example: freezeopt compare tiny-gpt --policies none,uniform,timelyfreeze,freezeopt --steps 120
    """
    from freezeopt.compare.run import CompareOptions, compare_job, format_compare
    from freezeopt.errors import InputError

    try:
        budgets = tuple(float(b) for b in sweep.split(",") if b.strip())
    except ValueError:
        raise InputError(f"--sweep {sweep!r}: write budgets like 0.05,0.1,0.2") from None
    opts = CompareOptions(
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),  # type: ignore[misc]
        steps=steps, warmup_steps=warmup_steps, budget=budget, repeats=repeats,
        val_every=val_every, overrun=overrun, sweep=budgets,
    )  # fmt: skip
    target = out if out is not None else Path("reports") / _job_name(job)
    command = shlex.join(["freezeopt", *sys.argv[1:]])
    rep = compare_job(
        job,
        out_dir=target,
        opts=opts,
        progress=not no_progress,
        command=command,
        tracking=_tracking(mlflow, tensorboard),
    )
    for w in rep.warnings:  # report.md lists them too; a table on a busy host must not look sound
        typer.echo(f"warning: {one_line(w)}", err=True)
    typer.echo(format_compare(rep))
    typer.echo(f"wrote {target / 'report.md'}")
    for t in rep.tracked:
        typer.echo(f"logged to {t}")


@app.command()
@_friendly
def track(
    folder: Annotated[
        Path, typer.Argument(help="A run folder (`train --out-dir`) or a `compare -o` folder.")
    ],
    mlflow: MlflowOpt = None,
    tensorboard: TensorboardOpt = None,
    profile: Annotated[
        Path | None,
        typer.Option(help="The profile the run's schedule was solved from: attach a Gantt chart."),
    ] = None,
) -> None:
    """Log a finished run, or a comparison, to MLflow and/or TensorBoard from its files.

    For a run that was trained without --mlflow/--tensorboard, or whose store was unreachable.
    A comparison becomes a parent run with one child per trained run.

    Example: freezeopt track runs/tiny-gpt --mlflow sqlite:///mlflow.db --tensorboard tb
    """
    from freezeopt.errors import InputError
    from freezeopt.tracking import track_compare, track_run

    opts = _tracking(mlflow, tensorboard)
    if not opts.enabled:
        raise InputError("nothing to log to: pass --mlflow [URI] and/or --tensorboard DIR")
    opts.check()
    if (folder / "results.json").is_file():
        if profile is not None:
            raise InputError("--profile is for a run folder; a comparison's folder has its own")
        tracked = track_compare(folder, opts)
    else:
        tracked = track_run(folder, opts, profile=profile)
    for t in tracked.lines(opts):
        typer.echo(f"logged to {t}")


def _job_name(job: str) -> str:
    from freezeopt.torchpp.job import load_job

    return load_job(job).name


@app.command()
@_friendly
def synth(
    out: Annotated[Path, typer.Option("-o", "--out", help="Profile file to write (JSON).")],
    schedule: Annotated[
        str,
        typer.Option(help="torch schedule name, or a CSV file with one row of actions per rank."),
    ] = "1F1B",
    ranks: Annotated[
        int | None, typer.Option(help="Pipeline ranks (default 4; a CSV schedule has its own).")
    ] = None,
    stages_per_rank: Annotated[
        int | None,
        typer.Option(help="Stages per rank (default: 1, or 2 for multi-stage schedules)."),
    ] = None,
    microbatches: Annotated[
        int | None,
        typer.Option(help="Microbatches per step (default 8; a CSV schedule has its own)."),
    ] = None,
    microbatch_size: Annotated[int, typer.Option(help="Samples per microbatch.")] = 4,
    groups: Annotated[int, typer.Option(help="Parameter groups per stage.")] = 4,
    forward_ms: Annotated[float, typer.Option(help="Forward cost of a stage (ms).")] = 10.0,
    backward_ms: Annotated[float, typer.Option(help="Full backward cost of a stage (ms).")] = 20.0,
    weight_share: Annotated[
        float, typer.Option(help="Share of the backward that is weight-gradient work.")
    ] = 0.5,
    jitter: Annotated[float, typer.Option(help="Stage-to-stage cost spread (relative).")] = 0.1,
    last_stage_factor: Annotated[
        float, typer.Option(help="Cost multiplier of the last stage (e.g. a big LM head).")
    ] = 1.0,
    noise: Annotated[float, typer.Option(help="Per-action cost noise (relative).")] = 0.02,
    lag_ms: Annotated[float, typer.Option(help="Point-to-point lag between ranks (ms).")] = 0.1,
    trace_steps: Annotated[
        int, typer.Option(help="Steps of synthetic gradient traces (0: none).")
    ] = 4,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Write a synthetic profile; the action order comes from torch's own schedule classes.

    Example: freezeopt synth --schedule ZBVZeroBubble --ranks 8 --microbatches 32 -o profiles/zbv.json
    """
    from freezeopt.commands import synth_file
    from freezeopt.profiling.synth import SynthOptions, check_csv_counts

    if schedule.lower().endswith(".csv"):
        check_csv_counts(
            schedule, ranks=ranks, microbatches=microbatches, stages_per_rank=stages_per_rank
        )
    defaults = SynthOptions()
    opts = SynthOptions(
        schedule=schedule,
        ranks=defaults.ranks if ranks is None else ranks,
        microbatches=defaults.microbatches if microbatches is None else microbatches,
        stages_per_rank=stages_per_rank,
        microbatch_size=microbatch_size, groups=groups, forward_ms=forward_ms, backward_ms=backward_ms,
        weight_share=weight_share, jitter=jitter, last_stage_factor=last_stage_factor, noise=noise,
        lag_ms=lag_ms, trace_steps=trace_steps, seed=seed,
    )  # fmt: skip
    p = synth_file(opts, out)
    typer.echo(
        f"wrote {out}: {p.pipeline.schedule}, {p.pipeline.world_size} ranks, {p.pipeline.n_stages} stages, "
        f"{p.pipeline.n_microbatches} microbatches, {len(p.actions)} actions"
    )


@app.command("solve")
@_friendly
def solve_cmd(
    profile: Annotated[
        Path, typer.Argument(help="Profile file (from `freezeopt profile` or `synth`).")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "-o", "--out", help="Schedule file to write (YAML); without it, nothing is written."
        ),
    ] = None,
    budget: Annotated[
        float, typer.Option(help="Largest share of one step's expected progress freezing may drop.")
    ] = 0.1,
    mode: Annotated[
        str,
        typer.Option(
            help="milp (exact, time-limited), lp (relaxation) or heuristic (answers within "
            "--time-limit: where the LP cannot solve in 80 % of it, from a rank-balanced start "
            "or a first-order relaxation, with a bound of their own)."
        ),
    ] = "milp",
    solver: Annotated[str, typer.Option(help="cbc (bundled) or highs.")] = "cbc",
    time_limit: Annotated[
        float,
        typer.Option(
            help="Seconds for the whole solve (LP, heuristic search, LP dives, MILP phases)."
        ),
    ] = 60.0,
    gap: Annotated[float, typer.Option(help="Relative MILP gap at which to stop.")] = 0.005,
    group_cap: Annotated[
        float, typer.Option(help="Largest share of microbatches in which one group may be frozen.")
    ] = 0.75,
    stage_cap: Annotated[
        float | None, typer.Option(help="Cap on a stage's mean freeze ratio (TimelyFreeze: 0.9).")
    ] = None,
    sensitivity: Annotated[
        str,
        typer.Option(
            help="auto (measured where the profile measured the loss cost, else gns), gns, "
            "measured (the probe loss the profiler measured), gns-raw, norm, numel or flat."
        ),
    ] = "auto",
    objective: Annotated[
        str,
        typer.Option(
            help="auto (ttq with the measured sensitivity, else step), step (the shortest step "
            "under --budget) or ttq (the least predicted time to quality, the budget chosen up to "
            "--budget; nothing frozen where freezing does not pay)."
        ),
    ] = "auto",
    tolerance: Annotated[
        float, typer.Option(help="Step-time slack phase 2 may use to drop less signal.")
    ] = 0.0,
    threads: Annotated[int, typer.Option(help="Solver threads.")] = 1,
    warmup_steps: Annotated[
        int, typer.Option(help="Full-update steps before freezing starts.")
    ] = 100,
    full_update_every: Annotated[
        int, typer.Option(help="One full-update step every N steps (0: never).")
    ] = 50,
    write_model: Annotated[
        Path | None, typer.Option(help="Write the PuLP model here (.lp or .mps).")
    ] = None,
    fallback: Annotated[
        str,
        typer.Option(
            help="none, or heuristic: on a solver failure in milp or lp, or where the LP would "
            "most likely not finish in the time limit, answer with the heuristic's search from "
            "a plan built without the LP."
        ),
    ] = "none",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Solve a profile for what to freeze where, and write the schedule.

    Example: freezeopt solve profiles/tiny-gpt-1f1b.json --budget 0.1 -o schedules/tiny-gpt-1f1b.yaml
    """
    from freezeopt.commands import format_solve, solve_file, solve_summary
    from freezeopt.formats.schedule import Phases
    from freezeopt.solver import SolveOptions

    opts = SolveOptions(
        mode=mode, solver=solver, budget=budget, group_cap=group_cap, stage_cap=stage_cap,  # type: ignore[arg-type]
        sensitivity=sensitivity, objective=objective, tolerance=tolerance,  # type: ignore[arg-type]
        time_limit=time_limit, gap=gap,
        threads=threads, write_model=write_model, fallback=fallback,  # type: ignore[arg-type]
    )  # fmt: skip
    r, sched = solve_file(
        profile,
        opts,
        phases=Phases(warmup_steps=warmup_steps, full_update_every=full_update_every),
        out=out,
    )
    if as_json:
        _print_json(solve_summary(r, out, sched))
    else:
        typer.echo(format_solve(r, out, sched))


@app.command()
@_friendly
def simulate(
    schedule: Annotated[Path, typer.Argument(help="Schedule file (YAML).")],
    profile: Annotated[
        Path, typer.Option("--profile", "-p", help="The profile it was solved from.")
    ],
    gantt: Annotated[
        Path | None,
        typer.Option(help="Save a Gantt chart (baseline above schedule) here (.png/.svg/.pdf)."),
    ] = None,
    measured: Annotated[
        Path | None,
        typer.Option(
            help="A training run's action log (RUN_DIR/actions.json): show the measured steps too."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict a schedule's step time and critical path; optionally draw the Gantt chart.

    With --measured, the steps `freezeopt train` timed are reported and drawn below the prediction.

    Example: freezeopt simulate schedules/x.yaml --profile profiles/x.json --gantt out/x.png
    """
    from freezeopt.model.timelines import format_simulate, simulate_files, simulate_summary

    rep = simulate_files(schedule, profile, gantt=gantt, measured=measured)
    for w in rep.warnings:
        typer.echo(f"warning: {one_line(w)}", err=True)
    if as_json:
        _print_json(simulate_summary(rep, gantt))
    else:
        typer.echo(format_simulate(rep, gantt))


@app.command()
@_friendly
def validate(
    schedule: Annotated[Path, typer.Argument(help="Schedule file (YAML).")],
    profile: Annotated[
        Path | None,
        typer.Option("--profile", "-p", help="Also check that it fits this profile's job."),
    ] = None,
) -> None:
    """Check a schedule file's schema and, with --profile, that it fits that job.

    Example: freezeopt validate schedules/x.yaml --profile profiles/x.json
    """
    from freezeopt.commands import validate_files

    sched, warnings = validate_files(schedule, profile)
    for w in warnings:
        typer.echo(f"warning: {one_line(w)}", err=True)
    fit = f", fits {profile}" if profile else ""
    typer.echo(f"ok: {schedule} (schema v{sched.schema_version}, {sched.pipeline.schedule}{fit})")


@app.command()
@_friendly
def schema(
    kind: Annotated[str, typer.Argument(help="profile or schedule.")],
) -> None:
    """Print the JSON Schema of profile or schedule files.

    Example: freezeopt schema schedule > schema/schedule.v1.json
    """
    from freezeopt.errors import InputError
    from freezeopt.formats.profile import profile_json_schema
    from freezeopt.formats.schedule import schedule_json_schema

    makers = {"profile": profile_json_schema, "schedule": schedule_json_schema}
    if kind not in makers:
        raise InputError(f"unknown schema {kind!r}; use profile or schedule")
    sys.stdout.write(json.dumps(makers[kind](), indent=2, sort_keys=True) + "\n")
