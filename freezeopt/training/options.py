"""What `train_job` is asked: one `TrainOptions`, composed of small configs that check themselves.

Composed as torchtitan composes its trainer's config: the phase overrides, the checkpointing and
the online re-planning each have a config of their own whose defaults mean "the schedule's own" or
"off", so a caller names only what it changes:

    TrainOptions(steps=60, out_dir=Path("runs/x"), schedule=Path("s.yaml"),
                 checkpoints=CheckpointOptions(every=20), replan=ReplanOptions(every=10, profile=p))

Each config refuses a value out of range when it is made, in an `InputError` that names the field
(`checkpoints.keep`); the command line says its flag instead (`--keep-checkpoints`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from freezeopt.errors import InputError, option
from freezeopt.formats.schedule import check_phase_flags
from freezeopt.solver import MODES, Mode
from freezeopt.tracking.options import TrackingOptions

__all__ = ["CheckpointOptions", "PhaseOverrides", "ReplanOptions", "TrainOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseOverrides:
    """The schedule's phases a run overrides (None: the schedule's own)."""

    warmup_steps: int | None = None
    """Full-update steps before freezing starts."""
    full_update_every: int | None = None
    """One full-update step every this many steps (0: never)."""

    def __post_init__(self) -> None:
        check_phase_flags(self.warmup_steps, self.full_update_every)

    @property
    def given(self) -> bool:
        return self.warmup_steps is not None or self.full_update_every is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointOptions:
    """Checkpoints: where a run starts, what it restores on drift, what it keeps."""

    resume: bool = False
    """Continue from the newest intact checkpoint in the run folder."""
    rollback: bool = False
    """On a loss, gradient or non-finite drift, also restore the last checkpoint."""
    keep: int = 3
    """Complete checkpoints kept."""
    every: int = 0
    """A checkpoint every this many steps (0: only at phase boundaries and the end)."""

    def __post_init__(self) -> None:
        if self.keep < 1:
            raise InputError(f"{option('checkpoints.keep')} must be at least 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplanOptions:
    """Online re-planning from the run's own measured costs (off unless `every`, `on_drift` or
    `costs`)."""

    profile: Path | None = None
    """The profile the schedule was solved from (its signal and lags; needed to re-plan)."""
    every: int = 0
    """Re-plan after every this many steps (0: never)."""
    on_drift: bool = False
    """Re-plan when the step-time drift rule fires, instead of falling back."""
    mode: Mode = "heuristic"
    time_limit: float = 10.0
    """Seconds for one re-plan's solve."""
    costs: bool = False
    """Adaptive freezing: re-plan by time to quality from the loss costs measured in warm-up and
    each full-update window (`freezeopt.training.replan`)."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise InputError(f"{option('replan.every')} must not be negative (0: never)")
        if self.mode not in MODES:
            raise InputError(
                f"{option('replan.mode')} must be one of {', '.join(MODES)} (got {self.mode!r})"
            )
        if not (math.isfinite(self.time_limit) and self.time_limit > 0):
            raise InputError(f"{option('replan.time_limit')} must be a positive number of seconds")
        if self.costs and (self.every or self.on_drift):
            raise InputError(
                f"{option('replan.costs')} re-plans by time to quality from measured loss costs; "
                f"{option('replan.every')} and {option('replan.on_drift')} re-plan by step time "
                "from the profile's: pass one of them"
            )

    @property
    def on(self) -> bool:
        return bool(self.every or self.on_drift or self.costs)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainOptions:
    """One training run: how long, where, with which schedule, and its sub-configs."""

    steps: int
    """Train until this optimizer step."""
    out_dir: Path
    """The run folder (metrics, events, checkpoints, the action log, the report)."""
    schedule: Path | None = None
    """The schedule file to replay (None: train without freezing)."""
    phases: PhaseOverrides = field(default_factory=PhaseOverrides)
    checkpoints: CheckpointOptions = field(default_factory=CheckpointOptions)
    replan: ReplanOptions = field(default_factory=ReplanOptions)
    tracking: TrackingOptions = field(default_factory=TrackingOptions)
    """Where the run is logged once it ends (MLflow, TensorBoard; default: nowhere)."""
    rescale: bool = True
    """Rescale a group frozen in k of M microbatches by M/(M−k) (False: for comparison)."""
    val_every: int = 0
    """A validation loss every this many steps (0: only at the end)."""
    stop_at_val_loss: float | None = None
    """End the run at the first validation from `stop_from` on once a validation loss of the run
    is at most this (an `early_stop` event; None: run all `steps`)."""
    stop_from: int = 0
    overwrite: bool = False
    """Replace an earlier run's files in `out_dir` (without it, a run folder that holds an earlier
    run is refused unless `checkpoints.resume` continues it: nothing is deleted by default)."""
    progress: bool = True
    """A progress bar on stderr."""
    fault: str | None = None
    """Injected faults, for tests (`freezeopt.torchpp.faults`)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise InputError(f"{option('steps')} must be at least 1 (got {self.steps})")
        if self.checkpoints.every < 0 or self.val_every < 0:
            raise InputError(
                f"{option('checkpoints.every')} and {option('val_every')} must not be negative "
                "(0: off)"
            )
        if self.stop_at_val_loss is not None and not (
            math.isfinite(self.stop_at_val_loss) and 0 <= self.stop_from <= self.steps
        ):
            raise InputError(
                f"{option('stop_at_val_loss')} must be finite and {option('stop_from')} within "
                "0..steps"
            )
        if self.overwrite and self.checkpoints.resume:
            raise InputError(
                f"{option('overwrite')} and {option('checkpoints.resume')} contradict each other; "
                "pass one"
            )
        if self.schedule is None and self.phases.given:
            raise InputError(
                f"{option('warmup_steps')} and {option('full_update_every')} need "
                f"{option('schedule')}"
            )
        if self.replan.on:
            flags = f"{option('replan.every')}, {option('replan.on_drift')} and {option('replan.costs')}"
            if self.schedule is None:
                raise InputError(f"{flags} need {option('schedule')}")
            if self.replan.profile is None:
                raise InputError(
                    f"{flags} need {option('replan.profile')} (the profile the schedule was "
                    "solved from)"
                )
