"""`freezeopt profile` on real pipelined torch runs: complete, self-consistent, every schedule, clean failures.

Every test here spawns real ranks (gloo, one thread each) and trains the tiny GPT on the stdlib
corpus at a small size. Nothing asserts on timing values; the checks are on completeness,
consistency (the DAG rebuilt from the file predicts the step time the file records) and the
mathematics of the gradient capture.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import statistics
from pathlib import Path

import pytest

from freezeopt.actions import parse_action
from freezeopt.errors import InputError, RankFailedError
from freezeopt.formats.profile import Profile, load_profile
from freezeopt.model.dag import build_dag
from freezeopt.model.simulate import simulate
from freezeopt.profiling.run import ProfileReport, format_report, profile_job
from freezeopt.torchpp.adapter import schedule_actions, schedule_composites
from freezeopt.torchpp.job import Job, load_job, replace_job
from freezeopt.torchpp.pipeline import plan_pipeline, preflight_model

SMALL = {
    "warmup_steps": 1,
    "measure_steps": 3,
    "microbatches": 4,
    "batch_size": 8,
    "seq_len": 32,
    "cost_samples": 4,
    "lag_samples": 4,
    "val_batches": 2,
    "model_args": {"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 4},
    "data_args": {"max_train_bytes": 300_000, "max_val_bytes": 60_000, "val_every": 10},
}


def small_job(**changes: object) -> Job:
    kw = dict(SMALL)
    kw.update(changes)
    return replace_job(load_job("tiny-gpt"), **kw)


def run(job: Job, tmp: Path, name: str = "p.json") -> tuple[Profile, ProfileReport]:
    report = profile_job(job, out=tmp / name, progress=False)
    assert report.path == tmp / name
    return load_profile(tmp / name), report


def check_consistent(p: Profile, job: Job, report: ProfileReport | None = None) -> None:
    """What every measured profile must satisfy, whatever the schedule (and its report, if given)."""
    assert p.provenance.source == "measured" and p.provenance.steps_measured == job.measure_steps
    ran = {parse_action(a) for rp in p.ranks for a in rp.actions}
    costed = {parse_action(ac.action): ac.cost_ms for ac in p.actions}
    assert ran == set(costed), "every executed action has a cost and vice versa"
    for a, st in costed.items():
        assert st.n == job.measure_steps
        split_stage0_input = a.stage == 0 and a.kind == "I"
        assert st.median > 0 or split_stage0_input, f"{a} has no cost"
        assert st.p10 <= st.median <= st.p90
    dag = build_dag(
        p
    )  # raises on any inconsistency (completeness, group costs ≤ actions, deadlock)
    sc = p.extra["self_check"]
    assert p.step_ms is not None and sc["measured_step_ms"] == pytest.approx(
        p.step_ms.median, rel=1e-5
    )
    assert sc["predicted_step_ms"] == pytest.approx(simulate(dag).makespan, rel=1e-4)
    assert sc["error"] == pytest.approx(
        (sc["predicted_step_ms"] - sc["measured_step_ms"]) / sc["measured_step_ms"],
        rel=1e-3,
        abs=1e-6,
    )
    assert {e.action for e in p.timeline} == {str(a) for a in ran}
    for rp in p.ranks:
        spans = {e.action: e for e in p.timeline if e.rank == rp.rank}
        ordered = [spans[a] for a in rp.actions]
        for u, v in itertools.pairwise(ordered):
            assert u.start_ms <= u.end_ms <= v.start_ms + 1e-3, (
                "a rank runs its actions one after another"
            )
        assert rp.optimizer_ms is not None and rp.optimizer_ms.median > 0
    assert p.extra["order_check"]["matches_schedule"], p.extra["order_check"]["mismatches"]
    # group costs are differences of two measured times (thread-CPU on CPU), within the noise at
    # this size: what is checked is that every round was taken and kept (their size is checked,
    # with wide bands, by tests/training/test_train.py's measured savings)
    detail = p.extra["group_costs"]["stages"]
    for st in p.stages:
        assert st.groups and all(g.numel > 0 for g in st.groups)
        for g in st.groups:
            c = g.weight_grad_ms
            assert c.n == job.cost_samples and 0 <= c.p10 <= c.median <= c.p90, (st.stage, g)
        d = detail[str(st.stage)]
        # a backward over all groups took time
        assert d["all_groups_ms"] > 0 and d["no_groups_ms"] >= 0
        if report is not None:
            zero = all(g.weight_grad_ms.median == 0 for g in st.groups)
            said = any(w.startswith(f"stage {st.stage}: every group's") for w in report.warnings)
            assert zero == said, "a stage whose group costs all measured 0 is warned about"
    assert len(p.loss) == job.measure_steps and all(math.isfinite(x) for x in p.loss)
    assert len(p.val_loss) == 2 and all(math.isfinite(x) for x in p.val_loss)


# --- the built-in job, in full detail --------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, ProfileReport, Job, Path]:
    tmp = tmp_path_factory.mktemp("builtin")
    job = small_job()
    p, report = run(job, tmp)
    return p, report, job, tmp / "p.json"


def test_builtin_profile_is_complete(builtin: tuple[Profile, ProfileReport, Job, Path]) -> None:
    p, report, job, _ = builtin
    check_consistent(p, job, report)
    expected = schedule_actions("1F1B", world_size=2, stages_per_rank=1, n_microbatches=4)
    assert [list(rp.actions) for rp in p.ranks] == [[str(a) for a in row] for row in expected]
    assert (
        p.pipeline.schedule == "1F1B"
        and p.pipeline.n_stages == 2
        and p.pipeline.microbatch_size == 2
    )
    assert [g.name for st in p.stages for g in st.groups] == [
        "blocks.0",
        "blocks.1",
        "blocks.2",
        "blocks.3",
    ]
    assert p.stages[0].groups[0].params[0].startswith("embed.")
    assert "head.weight" in p.stages[1].groups[-1].params
    prov = p.provenance
    assert (
        prov.torch
        and prov.torch.startswith("2.")
        and prov.device == "cpu"
        and prov.job == job.to_dict()
    )
    assert prov.job_sha256 is not None and len(prov.job_sha256) == 64
    data = p.extra["data"]
    assert data["python"] == prov.python and len(data["train_sha256"]) == 64
    assert {lg.kind for lg in p.lags} == {"F", "B"}
    assert all(lg.ms.median >= 0 for lg in p.lags)
    assert p.extra["group_costs"]["stages"]["1"]["measured_in"] == "full"


def test_gradient_traces_are_sound(builtin: tuple[Profile, ProfileReport, Job, Path]) -> None:
    p, _, job, _ = builtin
    assert len(p.gradients) == sum(len(st.groups) for st in p.stages)
    for tr in p.gradients:
        assert len(tr.microbatch_sq_norms) == job.measure_steps == len(tr.step_sq_norms)
        for mbs, step in zip(tr.microbatch_sq_norms, tr.step_sq_norms, strict=True):
            assert len(mbs) == job.microbatches and all(x > 0 for x in mbs)
            # |mean of g_i|² ≤ mean of |g_i|²; equality only if every microbatch had the same gradient
            assert 0 < step <= statistics.fmean(mbs) * (1 + 1e-5)
            assert step < max(mbs)
        assert len(tr.effective_perturbation) == job.measure_steps
        assert all(0 <= x <= 1 for x in tr.effective_perturbation)


def test_training_learns_and_is_validated(
    builtin: tuple[Profile, ProfileReport, Job, Path],
) -> None:
    p, _, job, _ = builtin
    losses = p.extra["train_loss_all_steps"]
    assert len(losses) == job.warmup_steps + job.measure_steps
    assert losses[0] == pytest.approx(math.log(256), rel=0.1), (
        "an untrained byte model is near uniform"
    )
    assert p.val_loss[1] < p.val_loss[0], "the validation loss drops after training on real text"


def test_report_and_file_agree(builtin: tuple[Profile, ProfileReport, Job, Path]) -> None:
    p, report, job, path = builtin
    sc = p.extra["self_check"]
    assert report.measured_step_ms == pytest.approx(sc["measured_step_ms"], rel=1e-5)
    assert report.predicted_step_ms == pytest.approx(sc["predicted_step_ms"], rel=1e-5)
    assert (report.explanation is None) == (abs(report.error) <= 0.10)
    assert report.order_ok and report.steps_measured == job.measure_steps
    text = format_report(report)
    assert (
        f"measured {report.measured_step_ms:.1f} ms" in text
        and f"DAG-predicted {report.predicted_step_ms:.1f} ms" in text
    )
    assert "blocks.3" in text and str(path) in text
    if report.explanation:
        assert "why:" in text
    assert json.loads(path.read_text())["schema_version"] == 1


def test_v1_files_without_a_timeline_still_load(
    builtin: tuple[Profile, ProfileReport, Job, Path], tmp_path: Path
) -> None:
    _, _, _, path = builtin
    data = json.loads(path.read_text())
    del data["timeline"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_profile(tmp_path / "old.json").timeline == ()


def test_fingerprints_go_into_the_schedule_and_refuse_a_model_of_another_width(
    builtin: tuple[Profile, ProfileReport, Job, Path], tmp_path: Path
) -> None:
    """Profiled at d_model 32, solved: `validate` passes on the profile and refuses one of another
    width, `train` refuses the job at d_model 16 (same stages and group names) before any rank
    starts, exit code 4, one line; an older profile without fingerprints still loads."""
    import yaml
    from typer.testing import CliRunner

    from freezeopt.cli import app

    p, _, job, path = builtin
    model = preflight_model(job, plan_pipeline(job))
    assert model is not None
    fps = tuple(tuple(g.fingerprint for g in st.groups) for st in p.stages)
    assert fps == tuple(model.fingerprints[s] for s in range(len(p.stages)))  # meta = real
    assert [int(fp.split("-")[0]) for row in fps for fp in row] == [
        g.numel for st in p.stages for g in st.groups
    ]
    cli = CliRunner()
    sched = tmp_path / "s.yaml"
    r = cli.invoke(app, ["solve", str(path), "--budget", "0.2", "-o", str(sched)])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(sched.read_text())["pipeline"]["fingerprints"] == [list(x) for x in fps]
    assert cli.invoke(app, ["validate", str(sched), "--profile", str(path)]).exit_code == 0

    data = json.loads(path.read_text())
    data["stages"][1]["groups"][0]["fingerprint"] = "1-0123456789abcdef"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    r = cli.invoke(app, ["validate", str(sched), "--profile", str(other)])
    assert r.exit_code == 4 and r.stderr.count("\n") == 1, r.output
    assert "of stage 1's group blocks.2 is" in r.stderr and "freezeopt solve" in r.stderr

    spec = tmp_path / "narrow.yaml"
    narrow = {**job.to_dict(), "model_args": {**job.model_args, "d_model": 16}}
    spec.write_text(yaml.safe_dump({k: v for k, v in narrow.items() if v is not None}))
    run_dir = tmp_path / "run"
    argv = ["train", str(spec), "--schedule", str(sched), "--steps", "2", "--out-dir", str(run_dir)]
    r = cli.invoke(app, argv)
    assert r.exit_code == 4 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(
        f"error: schedule {sched} does not fit job {job.name}: the fingerprint"
    )
    assert "of stage 0's group blocks.0 is" in r.stderr and "freezeopt profile" in r.stderr
    assert not run_dir.exists()  # nothing started

    for st in data["stages"]:  # written before fingerprints: loads, and only names are checked
        for g in st["groups"]:
            del g["fingerprint"]
    other.write_text(json.dumps(data))
    assert load_profile(other).stages[0].groups[0].fingerprint is None
    assert cli.invoke(app, ["validate", str(sched), "--profile", str(other)]).exit_code == 0


# --- every schedule ---------------------------------------------------------------------------------

SPLIT = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


@pytest.mark.parametrize(
    "schedule",
    [
        "GPipe",
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
    ],
)
def test_every_schedule_at_two_ranks(schedule: str, tmp_path: Path) -> None:
    spr = 1 if schedule == "GPipe" else 2
    job = small_job(schedule=schedule, stages_per_rank=spr)
    p, report = run(job, tmp_path)
    check_consistent(p, job, report)
    assert p.pipeline.n_stages == 2 * spr and report.order_ok
    expected = schedule_actions(schedule, world_size=2, stages_per_rank=spr, n_microbatches=4)
    assert [list(rp.actions) for rp in p.ranks] == [[str(a) for a in row] for row in expected]
    runs = schedule_composites(schedule, world_size=2, stages_per_rank=spr, n_microbatches=4)
    assert [list(map(list, rp.composites)) for rp in p.ranks] == [
        [[str(a) for a in run] for run in row] for row in runs
    ]
    assert any(rp.composites for rp in p.ranks) == (schedule == "DualPipeV")
    if schedule in SPLIT:
        # torch runs stage 0's whole backward in W; its I computes nothing
        cost = {ac.action: ac.cost_ms.median for ac in p.actions}
        i0 = [cost[f"0I{m}"] for m in range(4) if f"0I{m}" in cost]
        w0 = [cost[f"0W{m}"] for m in range(4) if f"0W{m}" in cost]
        assert i0 and w0 and max(i0) < 0.2 * min(w0)
        assert p.extra["stage_0_backward_in_w"]
        modes = {k: v["measured_in"] for k, v in p.extra["group_costs"]["stages"].items()}
        assert modes["0"] == "full"
        if (
            schedule != "DualPipeV"
        ):  # DualPipeV mixes B and I/W; its stages mostly run B at this size
            assert set(modes.values()) == {"full", "split"}


def test_csv_schedule(tmp_path: Path) -> None:
    csv = tmp_path / "zb.csv"
    csv.write_text(
        "0F0,0F1,0I0,0F2,0W0,0I1,0F3,0W1,0I2,0W2,0I3,0W3\n1F0,1I0,1W0,1F1,1I1,1W1,1F2,1I2,1W2,1F3,1I3,1W3\n"
    )
    job = small_job(schedule=str(csv))
    p, report = run(job, tmp_path)
    check_consistent(p, job, report)
    assert p.pipeline.schedule == "csv:zb.csv" and report.schedule == "csv:zb.csv"
    rows = [ln.split(",") for ln in csv.read_text().splitlines()]
    assert [list(rp.actions) for rp in p.ranks] == rows
    assert p.extra["schedule_csv"] == csv.read_text()
    assert p.extra["group_costs"]["stages"]["1"]["measured_in"] == "split"


@pytest.mark.parametrize(("schedule", "spr"), [("1F1B", 1), ("ZBVZeroBubble", 2)])
def test_four_ranks(schedule: str, spr: int, tmp_path: Path) -> None:
    """Four ranks on two cores: wall times are inflated, but the run must be complete and correct."""
    n_stages = 4 * spr
    job = small_job(
        schedule=schedule,
        ranks=4,
        stages_per_rank=spr,
        microbatches=8,
        batch_size=8,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": n_stages, "mlp_ratio": 2},
    )
    p, report = run(job, tmp_path)
    # four ranks time-share two cores and each stage holds one tiny block: a group's weight-gradient
    # time is below the timing noise there (it can come out 0, and is then warned about)
    check_consistent(p, job, report)
    assert p.pipeline.world_size == 4 and p.pipeline.n_stages == n_stages and report.order_ok
    assert sorted({st.rank for st in p.stages}) == [0, 1, 2, 3]


# --- gradient capture equals torch's own accumulation ----------------------------------------------


def test_captured_gradients_train_exactly_like_torch(
    builtin: tuple[Profile, ProfileReport, Job, Path], tmp_path: Path
) -> None:
    """Moving each microbatch's gradient aside and averaging at the end must give torch's update."""
    p, _, job, _ = builtin
    plain, _ = run(replace_job(job, gradient_traces=False), tmp_path)
    assert plain.gradients == ()
    a, b = p.extra["train_loss_all_steps"], plain.extra["train_loss_all_steps"]
    assert a[0] == b[0]
    assert a == pytest.approx(b, rel=1e-4)
    assert p.val_loss == pytest.approx(plain.val_loss, rel=1e-4)


# --- your own model through module:function ---------------------------------------------------------

USER_MODULE = """
import torch
from torch import nn
from freezeopt.errors import InputError
from freezeopt.torchpp.job import ModelParts


class Embed(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.mix = nn.Linear(width, width)

    def forward(self, idx):
        return torch.tanh(self.mix(self.tok(idx)))


def build(n_stages, seq_len, width=16):
    head = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 256))
    def loss_fn(logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
    return ModelParts(stages=[Embed(width), head], loss_fn=loss_fn)


def broken_data(batch_size, seq_len, seed, **kw):
    raise InputError("broken_data: the corpus is missing; point data_args.path at it")


class Raising(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, 256)

    def forward(self, x):
        if not x.is_meta:  # the preflight's meta-device pass goes through
            raise ValueError("the user's head broke on a real batch")
        return self.lin(x)


def build_raising(n_stages, seq_len, width=16):
    parts = build(n_stages, seq_len, width)
    return ModelParts(stages=[parts.stages[0], Raising(width)], loss_fn=parts.loss_fn)
"""


def test_user_model_via_module_function(tmp_path: Path) -> None:
    (tmp_path / "usermodel.py").write_text(USER_MODULE)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: user\nmodel: usermodel:build\nmodel_args: {width: 16}\nschedule: 1F1B\nranks: 2\n"
        "microbatches: 4\nbatch_size: 8\nseq_len: 16\nwarmup_steps: 1\nmeasure_steps: 2\n"
        "cost_samples: 3\nlag_samples: 3\nval_batches: 1\n"
        "data_args: {max_train_bytes: 100000, max_val_bytes: 20000}\n"
    )
    report = profile_job(spec, out=tmp_path / "user.json", progress=False)
    p = load_profile(tmp_path / "user.json")
    job = load_job(spec)
    check_consistent(p, job, report)
    assert report.job == "user"
    # default groups: the top-level children of each stage module
    assert [g.name for g in p.stages[0].groups] == ["tok", "mix"]
    assert [g.name for g in p.stages[1].groups] == ["0", "2"]
    assert p.stages[1].groups[1].numel == 16 * 256 + 256

    # an error in the user's own forward: torch wraps it ("[Stage 1] failed to run forward"),
    # the one line carries the cause
    raising = tmp_path / "raising.yaml"
    raising.write_text(spec.read_text().replace("usermodel:build", "usermodel:build_raising"))
    with pytest.raises(RankFailedError) as f:
        profile_job(raising, out=tmp_path / "raising.json", progress=False)
    msg = str(f.value)
    assert "\n" not in msg and "ValueError: the user's head broke on a real batch" in msg, msg

    spec.write_text(spec.read_text() + "data: usermodel:broken_data\n")
    with pytest.raises(InputError) as e:
        profile_job(spec, out=tmp_path / "broken.json", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rank ") and "the corpus is missing" in msg
    assert not (tmp_path / "broken.json").exists()


# --- failures stop every rank, name the culprit, write nothing --------------------------------------


def _log_of(msg: str) -> Path:
    m = re.search(r"rank log: (\S+\.log)\)", msg)
    assert m, msg
    return Path(m.group(1))


def test_crashing_rank_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "crash.json"
    with pytest.raises(RankFailedError) as e:
        profile_job(small_job(), out=out, progress=False, fault="crash:rank=1,step=2")
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        msg.startswith("rank 1 failed in step 2")
        and "injected fault" in msg
        and "no profile was written" in msg
    )
    assert e.value.rank == 1
    assert not out.exists()
    log = _log_of(msg)
    assert "RuntimeError: injected fault" in log.read_text()
    shutil.rmtree(log.parent)


def test_hanging_rank_is_detected(tmp_path: Path) -> None:
    out = tmp_path / "hang.json"
    with pytest.raises(RankFailedError) as e:
        profile_job(
            small_job(hang_timeout_s=3), out=out, progress=False, fault="hang:rank=1,step=1"
        )
    msg = str(e.value)
    assert (
        "\n" not in msg
        and msg.startswith("rank 1 hung in action 1F0 of step 1")
        and "rank 0 was waiting" in msg
    )
    assert e.value.rank == 1 and e.value.cause == "hang"
    assert not out.exists()
    shutil.rmtree(_log_of(msg).parent)


def test_fault_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREEZEOPT_FAULT", "crash:rank=0,step=1")
    with pytest.raises(RankFailedError) as e:
        profile_job(small_job(), out=tmp_path / "x.json", progress=False)
    assert str(e.value).startswith("rank 0 failed in step 1")
    shutil.rmtree(_log_of(str(e.value)).parent)


def test_a_nan_loss_stops_profiling_at_that_step_with_one_line_and_exit_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss of step 2 (the first measured one after a warm-up step) is NaN: the run stops
    there, not after its measured steps, cost rounds and lags, with one line naming the step and
    the learning rate, exit code 6, no traceback and no profile. The library raises
    DivergedError; what the measurement would have written never gets near the file."""
    import yaml
    from typer.testing import CliRunner

    from freezeopt.cli import app
    from freezeopt.errors import DivergedError

    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_job(measure_steps=6).to_dict()))
    out = tmp_path / "p.json"
    monkeypatch.setenv("FREEZEOPT_FAULT", "nan_loss:step=2")
    r = CliRunner().invoke(app, ["profile", str(job_file), "-o", str(out), "--no-progress"])
    assert r.exit_code == 6, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: rank 1: the training loss was nan at step 2 of 7"), line
    assert "no profile was written" in line and "lr: 0.001" in line
    assert not out.exists()
    monkeypatch.delenv("FREEZEOPT_FAULT")
    with pytest.raises(DivergedError, match="at step 0 of 7"):  # warm-up steps count too
        profile_job(small_job(measure_steps=6), out=out, progress=False, fault="nan_loss:step=0")
    assert not out.exists()


# --- under torchrun ----------------------------------------------------------------------------------

TORCHRUN_SCRIPT = """
import json, os, sys
from pathlib import Path
from freezeopt.profiling.run import profile_job

if __name__ == "__main__":
    overrides = json.loads(sys.argv[2])
    report = profile_job("tiny-gpt", out=Path(sys.argv[1]), progress=False, overrides=overrides)
    print(f"rank {os.environ['RANK']} report {report.path} {report.world_size}")
"""


def test_under_torchrun(tmp_path: Path) -> None:
    """Each torchrun process is one rank; rank 0 writes the file and every rank gets the report."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = tmp_path / "tr.json"
    overrides = dict(SMALL)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        str(script),
        str(out),
        json.dumps(overrides),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"rank 0 report {out} 2" in proc.stdout and f"rank 1 report {out} 2" in proc.stdout
    p = load_profile(out)
    check_consistent(p, small_job())
