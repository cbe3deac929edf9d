"""Where a run is tracked: an MLflow store, a TensorBoard folder, or both.

Checked before any work starts, so that a run is never trained only to find at its end that the
tracking library is missing or the store's address cannot be used.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from freezeopt.errors import InputError, option
from freezeopt.fileio import check_output_folder

__all__ = ["DEFAULT_MLFLOW_URI", "EXPERIMENT", "TrackingOptions", "default_mlflow_uri"]

DEFAULT_MLFLOW_URI = "sqlite:///mlflow.db"
"""The local store `--mlflow` without an address logs to (MLflow 3 keeps local runs in a
database; its artifacts go to `mlartifacts/` beside the database file)."""

EXPERIMENT = "freezeopt"
"""The MLflow experiment runs are logged under (unless the options name another)."""

_SCHEMES = ("sqlite:///", "http://", "https://", "postgresql://", "mysql://", "mssql://")


def default_mlflow_uri() -> str:
    """`MLFLOW_TRACKING_URI` where it is set, else the local sqlite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_MLFLOW_URI


@dataclass(frozen=True)
class TrackingOptions:
    """A run's tracking: `mlflow` a tracking URI (None: no MLflow), `tensorboard` a folder that
    gets one sub-folder of event files per run (None: no TensorBoard)."""

    mlflow: str | None = None
    tensorboard: Path | None = None
    experiment: str = EXPERIMENT

    def __post_init__(self) -> None:
        if self.mlflow is not None and not self.mlflow.startswith(_SCHEMES):
            raise InputError(
                f"{option('tracking.mlflow')} {self.mlflow!r} is not a tracking URI MLflow 3 "
                f"accepts here; give a database such as {DEFAULT_MLFLOW_URI} or a server such as "
                "http://127.0.0.1:5000"
            )
        if not self.experiment.strip():
            raise InputError("the MLflow experiment name must not be empty")

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None or self.tensorboard is not None

    def check(self) -> None:
        """Refuse, before any work, what logging would fail on: a missing library, an unusable
        folder."""
        if self.mlflow is not None:
            _need("mlflow", "mlflow", "tracking.mlflow")
            if self.mlflow.startswith("sqlite:///"):
                db = Path(self.mlflow.removeprefix("sqlite:///"))
                check_output_folder(db.parent if str(db.parent) else Path("."), "--mlflow")
        if self.tensorboard is not None:
            _need("tensorboard", "tensorboard", "tracking.tensorboard")
            check_output_folder(self.tensorboard, "--tensorboard")


def _need(module: str, extra: str, field: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise InputError(
            f"{option(field)} needs {module}, which is not installed; install it with "
            f"pip install 'freezeopt[{extra}]' (or make install-tracking)"
        )
