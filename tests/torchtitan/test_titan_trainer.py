"""torchtitan with a freeze schedule, for real: `freezeopt profile` on torchtitan's llama3 debug
model split as torchtitan splits it, `freezeopt solve`, then torchtitan's own trainer
(`FreezeTrainer`) on 4 gloo ranks — pipeline degree 2, FSDP2 shard degree 2 — replaying the
schedule, against the same job without one."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "torchtitan", reason="needs the freezeopt[torchtitan] extra (make test installs it)"
)

import torch

from freezeopt.formats.schedule import load_schedule
from freezeopt.torchtitan.data import write_tokenizer
from freezeopt.torchtitan.groups import group_names
from freezeopt.training.runtime import FreezeController

HERE = Path(__file__).resolve().parent
M = 4  # microbatches: local batch 4, microbatch size 1

JOB = """\
name: titan-llama3
model: freezeopt.torchtitan.model:llama3
model_args: {flavor: debugmodel}
data: stdlib-bytes
data_args: {corpus: docs, val_every: 4}
schedule: 1F1B
ranks: 2
stages_per_rank: 1
microbatches: 4
batch_size: 4
seq_len: 32
optimizer: adamw
lr: 0.0008
seed: 0
warmup_steps: 1
measure_steps: 3
device: cpu
cost_samples: 5
lag_samples: 5
gradient_traces: true
probe_batches: 0
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _titan(
    tmp: Path, out: str, *extra: str, ranks: int = 4, batch: int = M, steps: int = 3
) -> subprocess.CompletedProcess[str]:
    tok = write_tokenizer(tmp / "tok")
    shard = ["--parallelism.data_parallel_shard_degree", str(ranks // 2)]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
        "--master_port", str(_port()), str(HERE / "titan_run.py"),
        "--model.name", "llama3", "--model.flavor", "debugmodel",
        "--model.hf_assets_path", str(tok), "--training.dataset", "freezeopt-docs",
        "--parallelism.pipeline_parallel_degree", "2", *shard,
        "--training.local_batch_size", str(batch), "--training.seq_len", "32",
        "--training.steps", str(steps), "--debug.seed", "0", "--metrics.log_freq", "1",
        "--job.dump_folder", str(tmp / out), *extra,
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("titan")
    (tmp / "job.yaml").write_text(JOB)
    cli = [sys.executable, "-m", "freezeopt"]
    for args in (
        ["profile", str(tmp / "job.yaml"), "-o", str(tmp / "profile.json")],
        ["solve", str(tmp / "profile.json"), "--budget", "0.3", "-o", str(tmp / "schedule.yaml")],
    ):
        done = subprocess.run(cli + args, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    return tmp


@pytest.mark.slow
def test_torchtitan_replays_the_schedule_exactly_under_fsdp2(solved: Path) -> None:
    # the solved schedule, with a plan that leaves a group trained in every microbatch per stage,
    # one frozen in all and one in some
    data = yaml.safe_load((solved / "schedule.yaml").read_text())
    data["frozen"] = {
        0: {"layers.0": f"0-{M - 1}", "layers.1": "0,2"},
        1: {"layers.3": "1", "layers.5": f"0-{M - 1}"},
    }
    schedule = solved / "hand.yaml"
    schedule.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = _titan(
        solved, "frozen", "--freeze.schedule", str(schedule), "--freeze.warmup_steps", "0"
    )
    assert frozen.returncode == 0, frozen.stderr[-4000:]
    said = [ln for ln in frozen.stderr.splitlines() if ln.startswith("freezeopt: replaying")]
    assert len(said) == 1 and "frozen/freezeopt/" in said[0], said  # rank 0 only
    plain = _titan(solved, "plain")
    assert plain.returncode == 0, plain.stderr[-4000:]

    # the controller's record: every step replayed the schedule, with its prediction beside it
    rows = [
        json.loads(ln)
        for ln in (solved / "frozen/freezeopt/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["freezing"] and r["predicted_ms"] > 0 and r["step_ms"] > 0 for r in rows)
    assert all(len(r["grad_norms"]) >= 1 for r in rows)
    events = (solved / "frozen/freezeopt/events.jsonl").read_text()
    assert '"to": "freeze"' in events

    # step 1's reduced gradients against the unfrozen run's, from the same weights and data: a
    # group trained in every microbatch bit for bit, one frozen in all none, one frozen in some
    # another (rescaled) gradient
    sched = load_schedule(schedule)
    ctrl = FreezeController(sched, stages=[0, 1], warmup_steps=0)
    ctrl.begin_step(0)
    names = sched.pipeline.groups
    seen = {"trained": 0, "some": 0, "all": 0}
    for s in (0, 1):
        got = torch.load(solved / f"frozen/grads.{s}.pt")
        want = torch.load(solved / f"plain/grads.{s}.pt")
        assert got.keys() == want.keys()
        groups = group_names(list(want))
        assert tuple(groups) == names[s]
        for g, members in enumerate(groups.values()):
            k = sum(g in ctrl.frozen_groups(s, m) for m in range(M))
            for n in members:
                if k == 0:
                    seen["trained"] += 1
                    assert torch.equal(got[n], want[n]), (s, n)
                elif k == M:
                    seen["all"] += 1
                    assert got[n] is None, (s, n)
                else:
                    seen["some"] += 1
                    assert got[n] is not None and torch.isfinite(got[n]).all(), (s, n)
                    assert not torch.equal(got[n], want[n]), (s, n)
    assert seen["trained"] > 0 and seen["some"] > 0 and seen["all"] > 0, seen


@pytest.mark.slow
def test_a_schedule_for_another_pipeline_is_refused_in_one_line(solved: Path) -> None:
    done = _titan(
        solved, "wrong", "--freeze.schedule", str(solved / "schedule.yaml"), ranks=2, batch=2 * M
    )
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("freezeopt: ")]
    assert lines and "solved for another pipeline" in lines[0], done.stderr[-3000:]
    assert f"microbatches is {M} in the schedule but {2 * M} in this torchtitan job" in lines[0]


@pytest.mark.slow
def test_a_schedule_joins_a_running_job_and_resumes_where_it_was(solved: Path) -> None:
    """A checkpoint saved before the job had a schedule loads (torchtitan's loads are strict; it
    holds no controller state); one saved with it brings the controller back where it was."""
    ck = [
        "--checkpoint.enable",
        "--checkpoint.interval",
        "2",
        "--checkpoint.no-last-save-model-only",
    ]
    freeze = ["--freeze.schedule", str(solved / "schedule.yaml"), "--freeze.warmup_steps", "3"]
    for steps, extra in ((2, []), (4, freeze), (6, freeze)):
        done = _titan(solved, "resume", *ck, *extra, ranks=2, steps=steps)
        assert done.returncode == 0, (steps, done.stderr[-4000:])
    log = solved / "resume/freezeopt"
    rows = [json.loads(ln) for ln in (log / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3, 4, 5]  # counted from 0: torchtitan's steps 3 to 6
    assert [r["phase"] for r in rows] == ["warmup", "freeze", "freeze", "freeze"]
    events = [json.loads(ln) for ln in (log / "events.jsonl").read_text().splitlines()]
    phases = [(e["step"], e["from"], e["to"]) for e in events if e["event"] == "phase"]
    # the second run starts the controller at the checkpoint's step; the third restores it in
    # its freezing phase, so no phase change is logged at step 4
    assert phases == [(2, "init", "warmup"), (3, "warmup", "freeze")], phases
