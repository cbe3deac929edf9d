"""Tracking: a run folder logged to MLflow and/or TensorBoard once the run has ended.

Why after the run, from its files: the ranks never wait on a tracking server, a run whose store
was down can be logged later (`freezeopt track RUN`), and a store holds exactly what the run
folder holds. `track_run` logs a `freezeopt train` folder, `track_compare` a `freezeopt compare`
folder (a parent run with one child per trained run).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from freezeopt.errors import FreezeoptError, TrackingError, short
from freezeopt.tracking.options import DEFAULT_MLFLOW_URI, TrackingOptions, default_mlflow_uri
from freezeopt.tracking.record import TrackedRun, read_compare, read_run

T = TypeVar("T")

__all__ = [
    "DEFAULT_MLFLOW_URI",
    "Tracked",
    "TrackingOptions",
    "default_mlflow_uri",
    "track_compare",
    "track_run",
]


@dataclass(frozen=True)
class Tracked:
    """Where a run was logged: its MLflow run id and TensorBoard folder (None: not asked)."""

    mlflow_run_id: str | None = None
    tensorboard_dir: Path | None = None

    def lines(self, opts: TrackingOptions) -> list[str]:
        out = []
        if self.mlflow_run_id is not None:
            out.append(
                f"mlflow: run {self.mlflow_run_id} in {opts.mlflow} (experiment {opts.experiment})"
            )
        if self.tensorboard_dir is not None:
            out.append(
                f"tensorboard: {self.tensorboard_dir} (tensorboard --logdir {opts.tensorboard})"
            )
        return out


def track_run(
    run_dir: Path,
    opts: TrackingOptions,
    *,
    profile: Path | None = None,
    status: str = "FINISHED",
    with_report: bool = True,
    name: str | None = None,
) -> Tracked:
    """Log the `freezeopt train` run in `run_dir` (see `read_run` for `name`, `status` and
    `with_report`); with `profile` (the one its schedule was solved from) a Gantt chart of the
    predicted and measured steps is attached."""
    run_dir = Path(run_dir)
    with tempfile.TemporaryDirectory(prefix="freezeopt-track-") as tmp:
        gantt = None
        if profile is not None and with_report and (run_dir / "actions.json").is_file():
            gantt = _gantt(run_dir, profile, Path(tmp) / "gantt.png")
        run = read_run(run_dir, name=name, status=status, with_report=with_report, gantt=gantt)
        return _log(run, opts, run_dir)


def track_compare(out_dir: Path, opts: TrackingOptions) -> Tracked:
    """Log the `freezeopt compare` folder `out_dir`: the comparison (with its figures, the
    Gantt charts among them) and each of its runs as a child."""
    out_dir = Path(out_dir)
    return _log(read_compare(out_dir), opts, out_dir)


def _gantt(run_dir: Path, profile: Path, png: Path) -> Path | None:
    """The run's schedule simulated on `profile`, with its measured steps (None: no schedule)."""
    from freezeopt.model.timelines import simulate_files
    from freezeopt.tracking.record import schedule_file

    schedule = schedule_file(run_dir)
    if schedule is None:
        return None
    actions = run_dir / "actions.json"
    simulate_files(schedule, profile, gantt=png, measured=actions if actions.is_file() else None)
    return png


def _log(run: TrackedRun, opts: TrackingOptions, folder: Path) -> Tracked:
    rid = tb = None
    if opts.mlflow is not None:
        from freezeopt.tracking.mlflow_store import log_mlflow

        rid = _guard(
            lambda: log_mlflow(run, opts.mlflow or "", experiment=opts.experiment),
            "MLflow",
            opts.mlflow,
            folder,
        )
    if opts.tensorboard is not None:
        from freezeopt.tracking.tensorboard_store import log_tensorboard

        tb = _guard(
            lambda: log_tensorboard(run, opts.tensorboard or Path()),
            "TensorBoard",
            str(opts.tensorboard),
            folder,
        )
    return Tracked(mlflow_run_id=rid, tensorboard_dir=tb)


def _guard(fn: Callable[[], T], store: str, where: str | None, folder: Path) -> T:
    """Any failure of a store is one line: what failed, and how to log the run again."""
    try:
        return fn()
    except FreezeoptError:
        raise
    except Exception as e:
        cause = short(str(e).splitlines()[0] if str(e) else type(e).__name__, 160)
        raise TrackingError(
            f"logging to {store} at {where} failed ({type(e).__name__}: {cause}); the run's files are "
            f"in {folder}: log them again with `freezeopt track {folder}`"
        ) from None
