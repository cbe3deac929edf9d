"""A real training run logged to a real MLflow store (sqlite) and to TensorBoard event files,
read back with the libraries' own readers: as it ends, after a crash, and later with `track`."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from freezeopt.cli import app
from freezeopt.entry import optional_values
from freezeopt.formats.schedule import load_schedule
from freezeopt.tracking.record import SUMMARY, frozen_share, read_run
from tests.training.test_train import SMALL, small_job, write_schedule

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, optional_values(list(args)))


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run that crashes in step 3 (logged FAILED), then resumed to step 6 (logged FINISHED)."""
    tmp = tmp_path_factory.mktemp("tracked")
    spec = tmp / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "small", **SMALL}))
    sched = write_schedule(
        tmp / "s.yaml", small_job(), {0: {"blocks.1": "0-1"}, 1: {"blocks.3": "0-3"}}, warmup=2
    )
    uri = f"sqlite:///{tmp / 'store' / 'mlflow.db'}"
    common = ["train", str(spec), "--steps", "6", "--out-dir", str(tmp / "run"), "--val-every", "3",
              "--no-progress", "--tensorboard", str(tmp / "tb"), "--mlflow", uri]  # fmt: skip
    crashed = invoke(*common, "--schedule", str(sched), "--fault", "crash:rank=1,step=3")
    resumed = invoke(*common, "--schedule", str(sched), "--resume")
    return {"tmp": tmp, "uri": uri, "run": tmp / "run", "crashed": crashed, "resumed": resumed}


def _runs(uri: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("freezeopt")
    assert exp is not None
    return sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time)


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return [
        (m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    ]


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_crashed_run_is_logged_failed_and_its_resume_finished(tracked: dict[str, Any]) -> None:
    crashed, resumed = tracked["crashed"], tracked["resumed"]
    assert crashed.exit_code == 1 and "injected fault" in crashed.stderr, crashed.output
    assert resumed.exit_code == 0, resumed.output
    assert (
        "logged to mlflow: run " in resumed.stdout and "logged to tensorboard: " in resumed.stdout
    )
    failed, finished = _runs(tracked["uri"])
    assert failed.info.status == "FAILED" and finished.info.status == "FINISHED"
    assert failed.info.run_name == "small" and finished.info.run_name == "small"
    # the failed run holds the steps it ran (up to its crash), and no report: it wrote none
    assert [s for s, _ in _history(tracked["uri"], failed.info.run_id, "loss")] == [0, 1, 2]
    assert "run/measured_speedup" not in failed.data.metrics


def test_mlflow_holds_the_runs_files_figures_and_parameters(tracked: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    uri, run = tracked["uri"], tracked["run"]
    finished = _runs(uri)[-1]
    rid = finished.info.run_id
    recs = _metrics(run)
    losses = [(r["step"], r["loss"]) for r in recs if "loss" in r]
    assert [s for s, _ in losses] == list(range(6))  # the resume re-ran steps 2.. and kept 0..1
    assert _history(uri, rid, "loss") == losses  # doubles, as the run wrote them
    assert [s for s, _ in _history(uri, rid, "val_loss")] == [3, 6]
    share = frozen_share(load_schedule(run / "schedule.yaml"))
    assert share == pytest.approx((2 + 4) / (4 * 4))  # 6 of 16 group × microbatch cells
    freezing = {r["step"]: r["freezing"] for r in recs if "loss" in r}
    assert _history(uri, rid, "frozen_share") == [
        (s, share if freezing[s] else 0.0) for s in range(6)
    ]
    assert _history(uri, rid, "predicted_step_ms") == [
        (s, 9.0 if freezing[s] else 10.0) for s in range(6)
    ]
    assert {k for k in finished.data.metrics if k.startswith("grad_norm/")} == {
        "grad_norm/0/blocks.0", "grad_norm/0/blocks.1", "grad_norm/1/blocks.2", "grad_norm/1/blocks.3"
    }  # fmt: skip
    report = json.loads((run / "report.json").read_text())
    summary = {k: v for k, v in report.items() if k in SUMMARY and isinstance(v, float | int)}
    assert {"step_ms", "predicted_step_ms", "loss", "val_loss", "wall_s"} <= set(summary)
    assert {k: finished.data.metrics[f"run/{k}"] for k in summary} == summary
    assert _history(uri, rid, "events/resume") == [(2, 1.0)]
    p = finished.data.params
    text = (run / "schedule.yaml").read_text()
    assert p["schedule_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert p["job"] == "small" and p["pipeline"] == "1F1B" and p["solve.budget"] == "0.5"
    assert p["phases.warmup_steps"] == "2" and p["torch"].startswith("2.")
    client = MlflowClient(tracking_uri=uri)
    top = {a.path for a in client.list_artifacts(rid)}
    assert {"schedule.yaml", "report.json", "logs", "text"} <= top
    assert {a.path for a in client.list_artifacts(rid, "logs")} >= {
        "logs/metrics.jsonl",
        "logs/events.jsonl",
    }
    local = Path(client.download_artifacts(rid, "schedule.yaml", str(tracked["tmp"] / "dl")))
    assert local.read_text() == text
    # a local store keeps its artifacts beside its database, wherever the command ran
    assert (tracked["tmp"] / "store" / "mlartifacts" / rid / "artifacts" / "report.json").is_file()


def _scalars(folder: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_event_files_hold_the_same_figures(tracked: dict[str, Any]) -> None:
    run, tb = tracked["run"], tracked["tmp"] / "tb"
    assert sorted(p.name for p in tb.iterdir()) == [
        "small",
        "small-2",
    ]  # the failed run, then its resume
    acc = _scalars(tb / "small-2")
    tags = acc.Tags()
    assert {
        "loss",
        "val_loss",
        "step_ms",
        "predicted_step_ms",
        "frozen_share",
        "optimizer_ms",
    } <= set(tags["scalars"])
    recs = [r for r in _metrics(run) if "loss" in r]
    assert [e.step for e in acc.Scalars("loss")] == [r["step"] for r in recs]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx(
        [r["loss"] for r in recs], rel=1e-6
    )
    texts = {t.split("/")[0] for t in tags["tensors"]}
    assert {"schedule", "events", "report", "params", "status"} <= texts
    events = acc.Tensors("events/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "**resume**" in events and "**phase**" in events


def test_track_logs_a_run_folder_later(
    tracked: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp, run = tracked["tmp"], tracked["run"]
    uri = f"sqlite:///{tmp / 'later.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what a bare --mlflow logs to
    r = invoke("track", str(run), "--mlflow", "--tensorboard", str(tmp / "tb-later"))
    assert r.exit_code == 0, r.output
    assert f"in {uri} (experiment freezeopt)" in r.stdout
    (again,) = _runs(uri)
    first = _runs(tracked["uri"])[-1]
    assert again.data.metrics == first.data.metrics and again.data.params == first.data.params
    record = read_run(run)
    assert {s.key for s in record.scalars} == set(first.data.metrics)


def test_tracking_errors_are_one_line_and_come_before_the_work(
    tracked: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tracked["run"]
    r = invoke(
        "train", "tiny-gpt", "--steps", "3", "--out-dir", str(tmp_path / "r"), "--mlflow", "mlruns"
    )
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "sqlite:///mlflow.db" in r.stderr
    assert not (tmp_path / "r").exists()  # refused before any work
    r = invoke("track", str(tmp_path))
    assert r.exit_code == 2 and "pass --mlflow [URI] and/or --tensorboard DIR" in r.stderr
    r = invoke("track", str(tmp_path), "--tensorboard", str(tmp_path / "tb"))
    assert (
        r.exit_code == 2 and "not a freezeopt run folder" in r.stderr and r.stderr.count("\n") == 1
    )
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a)
    )
    r = invoke("track", str(run), "--mlflow", f"sqlite:///{tmp_path / 'x.db'}")
    assert r.exit_code == 2 and "pip install 'freezeopt[mlflow]'" in r.stderr
    monkeypatch.undo()
    # a store that cannot be reached: exit 7, one line, how to log the run again
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    cmd = [
        sys.executable,
        "-m",
        "freezeopt",
        "track",
        str(run),
        "--mlflow",
        f"http://127.0.0.1:{port}",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 7, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: logging to MLflow at http://127.0.0.1:")
        and f"freezeopt track {run}" in last
    )
    assert "Traceback" not in p.stderr


def test_optional_value_of_mlflow() -> None:
    assert optional_values(["train", "j", "--mlflow"]) == ["train", "j", "--mlflow", "default"]
    assert optional_values(["--mlflow", "--steps", "3"]) == ["--mlflow", "default", "--steps", "3"]
    assert optional_values(["--mlflow", "sqlite:///a.db"]) == ["--mlflow", "sqlite:///a.db"]
    assert optional_values(["--mlflow=http://h:5000"]) == ["--mlflow=http://h:5000"]
