"""Profile mode of freezeopt's torchtitan trainer, for real: torchtitan's llama3 debug model on 2
gloo ranks measured by torchtitan's own training loop into a profile, checked against
`freezeopt profile` of the same stages, solved, and replayed by torchtitan's trainer; profiling
leaves torchtitan's training as it was."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "torchtitan", reason="needs the freezeopt[torchtitan] extra (make test installs it)"
)

from freezeopt.formats.profile import load_profile
from freezeopt.torchtitan.data import write_tokenizer

M = 4  # microbatches: local batch 4, microbatch size 1
W, N = 1, 3  # warm-up and measured steps

JOB = f"""\
name: titan-llama3
model: freezeopt.torchtitan.model:llama3
model_args: {{flavor: debugmodel}}
data: stdlib-bytes
data_args: {{corpus: docs, val_every: 4}}
schedule: 1F1B
ranks: 2
stages_per_rank: 1
microbatches: {M}
batch_size: {M}
seq_len: 32
seed: 0
warmup_steps: {W}
measure_steps: {N}
cost_samples: 5
lag_samples: 5
probe_batches: 0
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _titan(
    tmp: Path, out: str, *extra: str, shard: int = 1, steps: int = W + N
) -> subprocess.CompletedProcess[str]:
    tok = write_tokenizer(tmp / "tok")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(2 * shard),
        "--master_port", str(_port()), "-m", "freezeopt.torchtitan",
        "--model.name", "llama3", "--model.flavor", "debugmodel",
        "--model.hf_assets_path", str(tok), "--training.dataset", "freezeopt-docs",
        "--parallelism.pipeline_parallel_degree", "2",
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--training.local_batch_size", str(M), "--training.seq_len", "32",
        "--training.steps", str(steps), "--debug.seed", "0", "--metrics.log_freq", "1",
        "--job.dump_folder", str(tmp / out), *extra,
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def _profile_flags(path: Path) -> list[str]:
    return [
        "--freeze.profile", str(path), "--freeze.profile_warmup_steps", str(W),
        "--freeze.profile_steps", str(N),
    ]  # fmt: skip


def _losses(log: str) -> list[str]:
    """torchtitan's logged loss per step, as printed by the last stage's rank (stdout)."""
    return re.findall(r"step:\s+\d+\s+\S*loss:\s+([0-9.]+)", re.sub(r"\x1b\[[0-9;]*m", "", log))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("titan-profile")
    done = _titan(tmp, "run", *_profile_flags(tmp / "profile.json"))
    assert done.returncode == 0, done.stderr[-4000:]
    (tmp / "stderr.txt").write_text(done.stderr)
    (tmp / "stdout.txt").write_text(done.stdout)  # torchtitan's log
    return tmp


@pytest.mark.slow
def test_torchtitan_profiles_a_job_freezeopt_solves_and_torchtitan_replays(
    profiled: Path,
) -> None:
    said = (profiled / "stderr.txt").read_text()
    assert said.count("freezeopt: profiling 1F1B (2 stages, 4 microbatches)") == 1  # rank 0
    assert "profile written to" in said
    prof = load_profile(profiled / "profile.json")
    assert prof.provenance.source == "measured" and prof.provenance.steps_measured == N
    assert prof.extra["order_check"]["matches_schedule"]
    assert prof.pipeline.n_microbatches == M and prof.pipeline.world_size == 2
    assert len(prof.loss) == N and all(x > 0 for x in prof.loss)
    # every action of every measured step, with a cost
    assert {a.action for a in prof.actions} == {
        f"{s}{k}{m}" for s in (0, 1) for k in "FB" for m in range(M)
    }
    assert all(a.cost_ms.median > 0 for a in prof.actions)
    # gradient traces: per group, per step, per microbatch; the step's mean gradient is no
    # larger than its microbatches' mean (norm), and not far below their mean over M
    # (the 32 tokens of a microbatch: a scaling slip by the token count breaks this band)
    assert len(prof.gradients) == 6
    for t in prof.gradients:
        assert len(t.step_sq_norms) == N and all(len(mb) == M for mb in t.microbatch_sq_norms)
        for mbs, step in zip(t.microbatch_sq_norms, t.step_sq_norms, strict=True):
            mean_norm = sum(x**0.5 for x in mbs) / M
            assert step <= mean_norm**2 * (1 + 1e-9), (t.group, mbs, step)
            assert step >= sum(mbs) / M / M / 4, (t.group, mbs, step)

    # the stages, groups and actions freezeopt's own profiler finds on the same model and split
    (profiled / "job.yaml").write_text(JOB)
    cli = [sys.executable, "-m", "freezeopt"]
    own = profiled / "own.json"
    done = subprocess.run(
        [*cli, "profile", str(profiled / "job.yaml"), "-o", str(own)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    mine = load_profile(own)
    # (torchtitan's names as it has them: activation checkpointing wraps every other layer)
    plain = [
        [(g.name, [n.replace("._checkpoint_wrapped_module", "") for n in g.params], g.fingerprint)
         for g in st.groups]
        for st in prof.stages
    ]  # fmt: skip
    assert plain == [
        [(g.name, list(g.params), g.fingerprint) for g in st.groups] for st in mine.stages
    ]
    assert [r.actions for r in prof.ranks] == [r.actions for r in mine.ranks]

    # solved, and replayed by torchtitan's trainer: the schedule fits the job it came from
    sched = profiled / "schedule.yaml"
    done = subprocess.run(
        [*cli, "solve", str(profiled / "profile.json"), "--budget", "0.3", "-o", str(sched)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sensitivity gns" in done.stdout  # no probe measured: the step objective on gns
    # replayed with a fixed frozen set (what the solver freezes on a tiny profile can be nothing:
    # its group costs are within the timing noise), so the freezing steps are known
    fixed = yaml.safe_load(sched.read_text())
    first = [st.groups[0].name for st in prof.stages]
    fixed["frozen"] = {0: {first[0]: "0-1"}, 1: {first[1]: f"2-{M - 1}"}}
    fixed["ratios"], fixed["realisation"] = {}, {}
    (profiled / "replay.yaml").write_text(yaml.safe_dump(fixed, sort_keys=False))
    done = _titan(
        profiled, "replay", "--freeze.schedule", str(profiled / "replay.yaml"),
        "--freeze.warmup_steps", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = (profiled / "replay/freezeopt/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["freezing"] for r in rows] == [False, True, True, True]


@pytest.mark.slow
def test_profiling_leaves_torchtitans_training_as_it_was(profiled: Path, tmp_path: Path) -> None:
    """The gradients moved aside per microbatch are summed back in the order autograd sums them:
    torchtitan's losses are those of the same job run without profiling, digit for digit."""
    plain = _titan(tmp_path, "plain")
    assert plain.returncode == 0, plain.stderr[-4000:]
    want = _losses(plain.stdout)
    assert len(want) == W + N
    assert _losses((profiled / "stdout.txt").read_text()) == want


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["LoopedBFS", "ZBVZeroBubble"])
def test_multi_stage_schedules_profile_and_train_as_without(tmp_path: Path, schedule: str) -> None:
    """Two stages per rank: looped placement whose backwards run last microbatch first
    (LoopedBFS), and the V placement with split input and weight gradients (ZBVZeroBubble).
    LoopedBFS validates every 2 steps in between (its forwards are not the profile's); torch
    2.13's `eval` fails on V schedules (`can't steal_bwd_input`), with or without freezeopt."""
    sched = ["--parallelism.pipeline_parallel_schedule", schedule]
    val = [
        "--validation.enable", "--validation.freq", "2", "--validation.steps", "1",
        "--validation.dataset", "freezeopt-docs-val", "--validation.seq_len", "32",
        "--validation.local_batch_size", str(M),
    ] if schedule == "LoopedBFS" else []  # fmt: skip
    profiled = _titan(tmp_path, "run", *sched, *val, *_profile_flags(tmp_path / "p.json"))
    assert profiled.returncode == 0, profiled.stderr[-4000:]
    plain = _titan(tmp_path, "plain", *sched, *val)
    assert plain.returncode == 0, plain.stderr[-4000:]
    assert _losses(profiled.stdout) == _losses(plain.stdout) != []
    prof = load_profile(tmp_path / "p.json")
    assert prof.extra["order_check"]["matches_schedule"]
    assert prof.pipeline.n_stages == 4 and prof.pipeline.schedule == schedule
    assert [st.rank for st in prof.stages] == (
        [0, 1, 1, 0] if schedule == "ZBVZeroBubble" else [0, 1, 0, 1]
    )
    kinds = {a.action[1] for a in prof.actions}
    assert {"I", "W"} <= kinds if schedule == "ZBVZeroBubble" else kinds == {"F", "B"}
    # one forward per stage and microbatch per step: validation's forwards were not recorded
    assert len([a for a in prof.actions if a.action[1] == "F"]) == 4 * M
    assert all(len(t.step_sq_norms) == N for t in prof.gradients)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "shard", "says"),
    [
        (["--freeze.schedule", "s.yaml"], 1, "freeze.profile and freeze.schedule are both set"),
        ([], 2, "profile mode measures the pipeline alone"),
        (["--freeze.profile_steps", "9"], 1, "set training.steps to 10 or more"),
    ],
)
def test_profile_mode_refuses_in_one_line(
    tmp_path: Path, extra: list[str], shard: int, says: str
) -> None:
    done = _titan(tmp_path, "bad", *_profile_flags(tmp_path / "p.json"), *extra, shard=shard)
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("freezeopt: ")]
    assert lines and says in lines[0], done.stderr[-3000:]
    assert not (tmp_path / "p.json").exists()
