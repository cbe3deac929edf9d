"""Distributed faults in a real 2-rank run: a rank killed with SIGKILL, a port already taken.

Both must stop every rank within a bounded time, name the rank and the cause in one line, write no
profile and leave no process behind. (Crashing and hanging ranks: tests/test_profile.py.)
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

import freezeopt.launch as launch
from freezeopt.errors import FreezeoptError
from freezeopt.job import load_job, replace_job
from freezeopt.profile import profile_job

pytestmark = pytest.mark.slow


def _job():
    return replace_job(
        load_job("tiny-gpt"),
        measure_steps=3,
        warmup_steps=1,
        cost_samples=2,
        lag_samples=4,
        val_batches=1,
        hang_timeout_s=10,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        data_args={"max_train_bytes": 100000, "max_val_bytes": 10000, "val_every": 10},
    )


def _children() -> set[int]:
    me, out = os.getpid(), set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me and b"resource_tracker" not in cmd:
                out.add(int(d.name))
    return out


def test_killed_rank_is_named(tmp_path: Path) -> None:
    before = _children()
    out = tmp_path / "p.json"
    t0 = time.monotonic()
    with pytest.raises(FreezeoptError) as e:
        profile_job(_job(), out=out, progress=False, fault="kill:rank=1,step=2")
    assert time.monotonic() - t0 < 120
    msg = str(e.value)
    assert msg.startswith("rank 1 ") and "killed by signal 9" in msg and "\n" not in msg
    assert not out.exists()
    assert _children() <= before


def test_port_already_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    monkeypatch.setattr(launch, "_free_port", lambda: port)
    before = _children()
    out = tmp_path / "p.json"
    try:
        with pytest.raises(FreezeoptError) as e:
            profile_job(_job(), out=out, progress=False)
    finally:
        taken.close()
    msg = str(e.value)
    assert "\n" not in msg and "rank" in msg
    assert "address already in use" in msg.lower() or str(port) in msg
    assert not out.exists()
    assert _children() <= before
