"""`TrainOptions(stop_at_val_loss=…)`: a run ends at the first validation from `stop_from` on once
its validation loss reaches the target, and runs to the end when it never does (real 2-rank runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from freezeopt.errors import InputError
from freezeopt.training.options import TrainOptions
from freezeopt.training.train import train_job
from tests.training.test_train import small_job

pytestmark = pytest.mark.slow


def test_stops_once_the_target_is_reached_not_before_stop_from(tmp_path: Path) -> None:
    # every validation loss is below 1e9: reached at step 4 already, but the run may stop only
    # from step 6 on, where it validates (6 is no multiple of val_every) and stops
    rep = train_job(
        small_job(),
        TrainOptions(
            steps=12,
            out_dir=tmp_path / "run",
            val_every=4,
            stop_at_val_loss=1e9,
            stop_from=6,
            progress=False,
        ),
    )
    assert rep.end_step == 6 and [s for s, _ in rep.val_losses] == [4, 6]
    assert rep.val_loss == rep.val_losses[-1][1]
    assert [s for s, _ in rep.losses] == list(range(6))
    stops = [e for e in rep.events if e["event"] == "early_stop"]
    assert stops == [
        {
            "step": 6,
            "event": "early_stop",
            "val_loss": min(v for _, v in rep.val_losses),
            "target": 1e9,
        }
    ]
    assert rep.checkpoints[-1].endswith("step-00000006")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics if "step_ms" in m) == 5


def test_runs_to_the_end_when_the_target_is_never_reached(tmp_path: Path) -> None:
    rep = train_job(
        small_job(),
        TrainOptions(
            steps=10,
            out_dir=tmp_path / "run",
            val_every=4,
            stop_at_val_loss=-1.0,
            stop_from=6,
            progress=False,
        ),
    )
    assert rep.end_step == 10 and [s for s, _ in rep.val_losses] == [4, 6, 8, 10]
    assert not any(e["event"] == "early_stop" for e in rep.events)


def test_bad_stop_options_are_refused(tmp_path: Path) -> None:
    for kw in ({"stop_at_val_loss": math.nan}, {"stop_at_val_loss": 1.0, "stop_from": 11}):
        with pytest.raises(InputError, match="stop_at_val_loss"):
            TrainOptions(steps=10, out_dir=tmp_path / "x", progress=False, **kw)  # type: ignore[arg-type]
