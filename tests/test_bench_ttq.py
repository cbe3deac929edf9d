"""`benchmarks/bench_ttq.py`'s progress kept by quarter, on small written run folders (the
benchmark itself runs in `make bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_ttq as mod


def _run(folder: Path, losses: dict[int, float]) -> object:
    folder.mkdir()
    lines = [json.dumps({"step": s, "loss": 9.0}) for s in range(3)]  # train steps: ignored
    lines += [json.dumps({"step": s, "val_loss": v}) for s, v in sorted(losses.items())]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return mod.Run(
        policy=folder.name, budget=0.1, repeat=0, step_ms=1.0, loss=0.0,
        val_loss=losses[max(losses)], curve=(), loss_curve=(), out_dir=str(folder),
    )  # fmt: skip


def test_progress_kept_by_quarter(tmp_path: Path) -> None:
    steps = range(10, 101, 10)
    # none falls 0.02 a step; "half" 0.01 a step throughout; "late" keeps pace, then half
    none = _run(tmp_path / "none", {s: 5.0 - 0.02 * s for s in steps})
    half = _run(tmp_path / "half", {s: 5.0 - 0.01 * s for s in steps})
    late = _run(
        tmp_path / "late",
        {s: 5.0 - 0.02 * min(s, 50) - 0.01 * max(0, s - 50) for s in range(10, 151, 10)},
    )
    assert mod._kept_by_quarter(half, none, 100) == pytest.approx([0.5] * 4)
    assert mod._kept_by_quarter(late, none, 100) == pytest.approx([1.0, 1.0, 0.5, 0.5])
    # a run ahead of none at the end: that quarter has no figure, the others do
    ahead = _run(tmp_path / "ahead", {s: 5.0 - 0.02 * s - (0.5 if s == 100 else 0) for s in steps})
    assert mod._kept_by_quarter(ahead, none, 100)[:3] == pytest.approx([1.0, 1.0, 1.0])
    assert mod._kept_by_quarter(ahead, none, 100)[3] is None
    # where none's curve rose again, the first time it fell to a loss counts
    bumpy = _run(tmp_path / "bumpy", {s: 5.0 - 0.02 * s + (0.3 if s == 60 else 0) for s in steps})
    slow = _run(tmp_path / "slow", {s: 5.0 - 0.011 * s for s in steps})
    # slow at step 100: 3.9, which none first reached between its steps 60 (4.1) and 70 (3.6)
    assert mod._kept_by_quarter(slow, bumpy, 100)[3] == pytest.approx((64 - 75 * 0.011 / 0.02) / 25)
    # 4.05 at step 25: none fell to it between 40 and 50 (47.5), and again between 60 and 70
    fast = _run(tmp_path / "fast", {s: 5.0 - 0.038 * s for s in steps})
    assert mod._kept_by_quarter(fast, bumpy, 100)[0] == pytest.approx(47.5 / 25)
