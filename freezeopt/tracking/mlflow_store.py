"""Log a `TrackedRun` to MLflow: one run per training run, a parent run for a comparison.

MLflow is imported here only (the `mlflow` extra: `mlflow-skinny` and, for the local sqlite
store, SQLAlchemy and Alembic). Runs go into the experiment `freezeopt` (created on first use);
for a local sqlite store its artifacts are kept in `mlartifacts/` beside the database file, not
in the folder the command happened to run in. Metrics are sent in batches within MLflow's
limits (1000 metrics, 100 parameters per call).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from freezeopt.errors import InputError
from freezeopt.tracking.record import TrackedRun

__all__ = ["log_mlflow"]

_BATCH = 1000
_PARAMS = 100


def log_mlflow(run: TrackedRun, uri: str, *, experiment: str) -> str:
    """Log `run` (and its children, as nested runs) to the store at `uri`; its run id."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)  # the store's first-use migrations
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        exp_id = exp.experiment_id
    else:
        exp_id = client.create_experiment(experiment, artifact_location=_artifact_root(uri))
    return _log(client, exp_id, run, parent=None)


def _artifact_root(uri: str) -> str | None:
    """`mlartifacts/` beside a local sqlite database (None: the server decides)."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///")).resolve()
    return (db.parent / "mlartifacts").as_uri()


def _log(client: Any, exp_id: str, run: TrackedRun, *, parent: str | None) -> str:
    from mlflow.entities import Metric, Param, RunTag

    tags = {k: v for k, v in run.tags}
    tags["mlflow.runName"] = run.name
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    created = client.create_run(exp_id, run_name=run.name, tags=tags)
    rid = created.info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in run.params]
    for i in range(0, len(params), _PARAMS):
        client.log_batch(rid, params=params[i : i + _PARAMS])
    metrics = [Metric(s.key, s.value, now, s.step) for s in run.scalars]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(rid, metrics=metrics[i : i + _BATCH])
    for title, text in run.texts:
        client.log_text(rid, text, f"text/{title}.md")
    for a in run.artifacts:
        if not a.path.is_file():
            raise InputError(f"{a.path} is gone: cannot attach it to the MLflow run")
        client.log_artifact(rid, str(a.path), artifact_path=a.folder or None)
    for child in run.children:
        _log(client, exp_id, child, parent=rid)
    client.log_batch(rid, tags=[RunTag("freezeopt.children", str(len(run.children)))])
    client.set_terminated(rid, status=run.status)
    return str(rid)
