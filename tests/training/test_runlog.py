"""A run's logs: a run from its first step starts them afresh, a resumed one keeps the steps
before its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from freezeopt.training.runlog import RunLog


def _steps(path: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in path.read_text().splitlines()]


def _run(out: Path, start: int, stop: int) -> None:
    log = RunLog(out, writes=True)
    log.open(start)
    for step in range(start, stop):
        log.add_events([{"step": step, "event": "phase"}])
        log.add_metrics({"step": step, "loss": float("nan") if step == 1 else 1.0})
    log.close()


def test_a_fresh_run_replaces_the_logs_and_a_resume_keeps_the_steps_before_it(
    tmp_path: Path,
) -> None:
    _run(tmp_path, 0, 4)
    _run(tmp_path, 0, 3)  # the same folder again, from step 0: nothing of the first run is left
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2]
    assert _steps(tmp_path / "events.jsonl") == [0, 1, 2]
    _run(tmp_path, 2, 5)  # resumed at 2: step 2 runs again, steps 0 and 1 stay
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4]
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["loss"] == "nan"  # non-finite numbers as strings: every line is JSON


def test_a_rank_that_does_not_write_leaves_no_files(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "r1", writes=False)
    log.open(0)
    log.add_events([{"step": 0}])
    log.close()
    assert not (tmp_path / "r1").exists() and log.events == [{"step": 0}]
