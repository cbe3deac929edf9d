"""`freezeopt train` on real pipelined runs (2 ranks, gloo, tiny GPT): semantics, drift, resume, fit.

Every multi-process test trains the tiny GPT on the stdlib corpus at a small size. Nothing asserts
on speed: the checks are on training semantics (bit-identical runs, untouched frozen weights,
rescaled gradients checked against gradients computed here without a pipeline), on the controller's
reactions to injected faults, on exact resumption, and — the one test that reads timings — on
per-action *costs* (thread-CPU time) against the profile, with a tolerance wide enough for CPU noise.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from freezeopt.actions import parse_action
from freezeopt.commands import solve_file
from freezeopt.errors import DivergedError, InputError, MismatchError, RankFailedError
from freezeopt.examples.tiny_gpt import build_model, stdlib_bytes
from freezeopt.formats.fingerprint import fingerprint
from freezeopt.formats.profile import load_profile
from freezeopt.formats.schedule import Drift, Phases, load_schedule
from freezeopt.model.dag import build_dag, schedule_plan
from freezeopt.model.timelines import simulate_files
from freezeopt.profiling.run import profile_job
from freezeopt.solver import SolveOptions
from freezeopt.torchpp.faults import damage_file
from freezeopt.torchpp.job import Job, load_job, replace_job
from freezeopt.torchpp.pipeline import plan_pipeline, preflight_model
from freezeopt.training.options import CheckpointOptions, PhaseOverrides, TrainOptions
from freezeopt.training.train import TrainReport, format_train_report, train_job

pytestmark = pytest.mark.slow

SMALL: dict[str, Any] = {
    "warmup_steps": 1,  # the job's unmeasured steps (torch's one-time setup)
    "microbatches": 4,
    "batch_size": 8,
    "seq_len": 32,
    "val_batches": 1,
    "hang_timeout_s": 30,
    "model_args": {"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 4},
    "data_args": {"max_train_bytes": 200_000, "max_val_bytes": 40_000, "val_every": 10},
}
M = 4


def small_job(**changes: Any) -> Job:
    return replace_job(load_job("tiny-gpt"), **{**SMALL, **changes})


def write_schedule(
    path: Path,
    job: Job,
    frozen: dict[int, dict[str, str]],
    *,
    warmup: int = 0,
    every: int = 0,
    fallback_steps: int = 20,
    step_time_error: float = 1e6,
    ratios: dict[int, dict[str, dict[int, float]]] | None = None,
    realisation: dict[str, Any] | None = None,
    progression: dict[str, Any] | None = None,
) -> Path:
    """A hand-made schedule file that fits `job` (prediction: 10 ms without freezing, 9 ms with),
    its groups' fingerprints those of the job's model (as `freezeopt profile` records them)."""
    plan = plan_pipeline(job)
    model = preflight_model(job, plan)
    assert model is not None
    groups = model.groups
    data = {
        "schema_version": 1,
        "provenance": {
            "freezeopt": "test",
            "profile_sha256": "0" * 64,
            "profile_source": "synth",
            "mode": "heuristic",
            "solver": "cbc",
            "status": "heuristic",
            "sensitivity": "flat",
            "budget": 0.5,
            "group_cap": 1.0,
        },
        "pipeline": {
            "schedule": plan.label,
            "world_size": job.ranks,
            "n_stages": plan.n_stages,
            "n_microbatches": job.microbatches,
            "stage_to_rank": list(plan.stage_rank),
            "groups": [[g for g, _ in groups[s]] for s in range(plan.n_stages)],
            "fingerprints": [list(model.fingerprints[s]) for s in range(plan.n_stages)],
        },
        "phases": {
            "warmup_steps": warmup,
            "full_update_every": every,
            "drift": {"fallback_steps": fallback_steps, "step_time_error": step_time_error},
        },
        "prediction": {
            "baseline_ms": 10.0,
            "all_frozen_ms": 8.0,
            "lp_bound_ms": 9.0,
            "predicted_ms": 9.0,
            "gap": 0.0,
            "signal_dropped": 0.1,
        },
        "frozen": frozen,
        "ratios": ratios or {},
        "realisation": realisation or {},
    }
    if progression is not None:
        data["progression"] = progression
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def final_state(report: TrainReport) -> dict[int, dict[str, Any]]:
    """rank → its state in the run's last checkpoint."""
    last = Path(report.checkpoints[-1])
    return {r: torch.load(last / f"rank{r}.pt", weights_only=False) for r in range(2)}


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]


# --- semantics ------------------------------------------------------------------------------------


def test_all_zero_schedule_is_bit_identical_to_no_controller(tmp_path: Path) -> None:
    job = small_job()
    plain = train_job(job, TrainOptions(steps=4, out_dir=tmp_path / "plain", progress=False))
    zero = write_schedule(tmp_path / "zero.yaml", job, {})
    ctrl = train_job(
        job, TrainOptions(schedule=zero, steps=4, out_dir=tmp_path / "zero", progress=False)
    )
    assert [loss for _, loss in plain.losses] == [loss for _, loss in ctrl.losses]
    assert plain.val_loss == ctrl.val_loss and plain.val_loss is not None
    a, b = final_state(plain), final_state(ctrl)
    for r in range(2):
        for s, sd in a[r]["model"].items():
            for name, t in sd.items():
                assert torch.equal(t, b[r]["model"][s][name]), (r, s, name)
        for i, st in a[r]["optimizer"]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, b[r]["optimizer"]["state"][i][k]), (r, i, k)


def _reference_grad_norms(job: Job, mbs: list[int]) -> dict[str, float]:
    """Per group, the norm of the mean over `mbs` of the per-microbatch gradients at step 0."""
    torch.manual_seed(job.seed)
    parts = build_model(n_stages=2, seq_len=job.seq_len, **job.model_args)
    data = stdlib_bytes(
        batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, **job.data_args
    )
    x, y = data.train(0)
    rows = job.batch_size // M
    for m in mbs:
        h = x[m * rows : (m + 1) * rows]
        for st in parts.stages:
            h = st(h)
        (parts.loss_fn(h, y[m * rows : (m + 1) * rows]) / len(mbs)).backward()
    out = {}
    assert parts.groups is not None
    for s, st in enumerate(parts.stages):
        named = dict(st.named_parameters())
        for g, names in parts.groups[s].items():
            out[f"{s}/{g}"] = math.sqrt(
                sum(float(named[n].grad.double().pow(2).sum()) for n in names)
            )
    return out


def test_frozen_everywhere_untouched_and_partial_rescaled(tmp_path: Path) -> None:
    """blocks.2 frozen in every microbatch; blocks.1 in microbatches 0-1 of 4 (rescaled by 4/2)."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml", job, {0: {"blocks.1": "0-1"}, 1: {"blocks.2": "0-3"}}
    )
    rep = train_job(
        job, TrainOptions(schedule=sched, steps=2, out_dir=tmp_path / "run", progress=False)
    )
    # gradients of step 0, as logged: blocks.1 is the mean over microbatches 2 and 3 only
    logged = metrics(tmp_path / "run")[0]["grad_norms"]
    full = _reference_grad_norms(job, [0, 1, 2, 3])
    odd = _reference_grad_norms(job, [2, 3])
    assert "1/blocks.2" not in logged  # frozen in all: grad None, no norm
    assert logged["0/blocks.1"] == pytest.approx(odd["0/blocks.1"], rel=1e-4)
    assert logged["0/blocks.1"] != pytest.approx(full["0/blocks.1"], rel=1e-2)
    for g in ("0/blocks.0", "1/blocks.3"):
        assert logged[g] == pytest.approx(full[g], rel=1e-4)
    # weights and optimizer state of the group frozen everywhere are untouched
    torch.manual_seed(job.seed)
    init = build_model(n_stages=2, seq_len=job.seq_len, **job.model_args)
    assert init.groups is not None
    frozen_names = set(init.groups[1]["blocks.2"])
    names = [n for n, _ in init.stages[1].named_parameters()]
    st = final_state(rep)[1]
    for n, p in init.stages[1].named_parameters():
        same = torch.equal(st["model"][1][n], p.detach())
        assert same == (n in frozen_names), n
    with_state = {names[i] for i in st["optimizer"]["state"]}
    assert with_state == set(names) - frozen_names


# --- resume and drift -----------------------------------------------------------------------------


def test_crash_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {0: {"blocks.1": "0-1"}, 1: {"blocks.3": "2-3"}},
        warmup=2,
        every=3,
    )
    base = TrainOptions(schedule=sched, steps=10, progress=False, out_dir=tmp_path / "whole")
    resume = CheckpointOptions(resume=True)
    whole = train_job(job, base)
    with pytest.raises(RankFailedError) as e:
        train_job(
            job, dataclasses.replace(base, out_dir=tmp_path / "cut", fault="crash:rank=1,step=7")
        )
    assert "can continue from its last checkpoint with --resume" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(RankFailedError) as e:  # before the first checkpoint (entering step 2)
        train_job(
            job, dataclasses.replace(base, out_dir=tmp_path / "early", fault="crash:rank=1,step=1")
        )
    assert "no checkpoint yet, so run it again without --resume" in str(e.value)
    shutil.copytree(tmp_path / "cut", tmp_path / "damaged")
    rest = train_job(job, dataclasses.replace(base, out_dir=tmp_path / "cut", checkpoints=resume))
    # checkpoints are taken entering freezing: after warm-up (2) and after the full window at 5 (6)
    assert rest.start_step == 6
    assert rest.losses == whole.losses[6:]
    assert rest.val_loss == whole.val_loss
    a, b = final_state(whole), final_state(rest)
    for r in range(2):
        for s, sd in a[r]["model"].items():
            for name, t in sd.items():
                assert torch.equal(t, b[r]["model"][s][name]), (r, s, name)
        timing = ("step_times", "full_step_times")  # wall-clock samples differ between runs
        ca, cb = ({k: v for k, v in c[r]["controller"].items() if k not in timing} for c in (a, b))
        assert ca == cb
    evs = events(tmp_path / "cut")
    ck6 = str(tmp_path / "cut" / "checkpoints" / "step-00000006")
    assert {"step": 6, "event": "resume", "checkpoint": ck6} in evs
    assert [m["step"] for m in metrics(tmp_path / "cut") if "loss" in m] == list(range(10))
    with pytest.raises(InputError, match="larger than 10"):
        train_job(job, dataclasses.replace(base, out_dir=tmp_path / "cut", checkpoints=resume))
    # a damaged newest checkpoint: detected by its checksum, the one before it is used
    damage_file(tmp_path / "damaged" / "checkpoints" / "step-00000006" / "rank1.pt")
    older = train_job(
        job, dataclasses.replace(base, out_dir=tmp_path / "damaged", checkpoints=resume)
    )
    assert older.start_step == 2 and older.losses == whole.losses[2:]
    assert any("step-00000006" in w and "corrupted" in w for w in older.warnings)
    bad = [e for e in events(tmp_path / "damaged") if e["event"] == "checkpoint_corrupt"]
    assert len(bad) == 1 and bad[0]["step"] == 2 and "rank1.pt" in bad[0]["reason"]


def test_injected_drift_falls_back_rolls_back_and_recovers(tmp_path: Path) -> None:
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {0: {"blocks.1": "0-1"}, 1: {"blocks.3": "2-3"}},
        warmup=2,
        fallback_steps=3,
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=24,
            out_dir=tmp_path / "run",
            fault="lr_spike:step=15,factor=1000",
            progress=False,
            checkpoints=CheckpointOptions(rollback=True),
        ),
    )
    evs = list(rep.events)
    assert evs == events(tmp_path / "run")
    drifts = [e for e in evs if e["event"] == "drift"]
    assert drifts and drifts[0]["step"] == 16 and drifts[0]["rules"], drifts
    assert rep.fallbacks == len(drifts) and rep.rollbacks >= 1
    rb = next(e for e in evs if e["event"] == "rollback")
    assert rb["step"] == 16 and rb["to_step"] == 2  # the checkpoint taken when freezing began
    phases = [(e["step"], e["from"], e["to"]) for e in evs if e["event"] == "phase"]
    assert (17, "freeze", "fallback") in phases and (20, "fallback", "freeze") in phases
    assert any(e["event"] == "checkpoint" and e["step"] == 20 for e in evs)
    losses = dict(rep.losses)
    assert losses[16] > 2 * losses[15]  # the spike really hurt
    assert math.isfinite(losses[23]) and losses[23] < 0.5 * losses[16]  # and the run recovered
    assert len(drifts) == 1  # no drift after the rollback: the trend came back with the weights


def test_a_run_that_never_recovers_from_a_nan_loss_says_so_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    """From step 2 on every loss is NaN: each step is a `nonfinite` event (updates skipped, no
    schedule needed), the run's files are written, and the command exits 6 with one line."""
    from typer.testing import CliRunner

    from freezeopt.cli import app

    spec, out = tmp_path / "job.yaml", tmp_path / "run"
    spec.write_text(yaml.safe_dump({"name": "small", **SMALL}))
    argv = ["train", str(spec), "--steps", "5", "--out-dir", str(out), "--no-progress"]
    r = CliRunner().invoke(app, [*argv, "--fault", "nan_loss:step=2,steps=100"])
    assert r.exit_code == 6, r.output
    assert r.stderr.startswith("error: the training loss was not finite from step 2 to the end")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.output
    evs = events(out)
    assert [e["step"] for e in evs if e["event"] == "nonfinite"] == [2, 3, 4]
    assert json.loads((out / "report.json").read_text())["loss"] == "nan"
    with pytest.raises(DivergedError):
        train_job(
            small_job(),
            TrainOptions(
                steps=4, out_dir=tmp_path / "lib", progress=False, fault="nan_loss:step=1,steps=9"
            ),
        )
    # a NaN that passes (one step) is recovered from: no error
    rep = train_job(
        small_job(),
        TrainOptions(steps=4, out_dir=tmp_path / "once", progress=False, fault="nan_loss:step=1"),
    )
    assert math.isfinite(rep.loss or math.nan)


def test_nan_loss_rolls_back_past_a_corrupted_checkpoint(tmp_path: Path) -> None:
    """A NaN loss skips the update and rolls back; the newest checkpoint was damaged on disk in the
    meantime, so the rollback detects it by its checksum and takes the one before."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml", job, {0: {"blocks.1": "0-1"}, 1: {"blocks.3": "2-3"}}, warmup=2
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=18,
            out_dir=tmp_path / "run",
            fault="corrupt_checkpoint:step=15,rank=1;nan_loss:step=15",
            progress=False,
            checkpoints=CheckpointOptions(rollback=True, every=5),
        ),
    )
    evs = events(tmp_path / "run")
    assert [e["step"] for e in evs if e["event"] == "checkpoint"][:4] == [2, 5, 10, 15]
    drift = next(e for e in evs if e["event"] == "drift")
    assert drift["step"] == 15 and "nonfinite" in drift["rules"], drift
    bad = [e for e in evs if e["event"] == "checkpoint_corrupt"]
    assert len(bad) == 1 and bad[0]["checkpoint"].endswith("step-00000015"), bad
    assert "rank1.pt" in bad[0]["reason"]
    rb = next(e for e in evs if e["event"] == "rollback")
    assert rb["step"] == 15 and rb["to_step"] == 10
    m = {r["step"]: r for r in metrics(tmp_path / "run") if "loss" in r}
    assert m[15]["skipped_update"] and not math.isfinite(float(m[15]["loss"]))
    assert all(math.isfinite(m[s]["loss"]) for s in (16, 17)) and math.isfinite(rep.val_loss or 0)


def test_corrupted_batches_fall_back_and_the_run_recovers(tmp_path: Path) -> None:
    """Three batches of random bytes: the loss leaves its trend, full updates take over for a
    window (no rollback), and freezing resumes once the data is clean again."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {0: {"blocks.1": "0-1"}, 1: {"blocks.3": "2-3"}},
        warmup=2,
        fallback_steps=3,
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=24,
            out_dir=tmp_path / "run",
            fault="corrupt_batch:step=16,steps=3",
            progress=False,
        ),
    )
    drifts = [e for e in rep.events if e["event"] == "drift"]
    assert drifts and 16 <= drifts[0]["step"] <= 18 and "loss_rise" in drifts[0]["rules"]
    assert rep.rollbacks == 0
    back = [e["step"] for e in rep.events if e["event"] == "phase" and e["to"] == "freeze"]
    assert back and back[-1] > drifts[-1]["step"]  # freezing resumed after the fallback
    losses = dict(rep.losses)
    assert max(losses[s] for s in (20, 21, 22, 23)) < min(losses[s] for s in (16, 17, 18))


def test_slowed_stage_is_caught_by_the_step_time_rule(tmp_path: Path) -> None:
    """A stage spinning 15 ms per action makes freezing steps several times slower than calibrated."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {1: {"blocks.3": "2-3"}},
        warmup=5,
        fallback_steps=2,
        step_time_error=0.25,
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=sched,
            steps=11,
            out_dir=tmp_path / "run",
            fault="slow:stage=1,ms=15,step=5",
            progress=False,
        ),
    )
    drifts = [e for e in rep.events if e["event"] == "drift"]
    assert drifts and drifts[0]["rules"] == ["step_time"] and drifts[0]["step"] == 9


def test_timelyfreeze_realisation_random_tensors(tmp_path: Path) -> None:
    """`random_tensors`: round(r·n) of a stage's n tensors per microbatch, redrawn, not rescaled."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {},
        ratios={1: {"blocks.2": {0: 0.5, 1: 0.5}, "blocks.3": {0: 0.5, 1: 0.5}}},
        realisation={"kind": "random_tensors", "rescale": False, "redraw_every": 2, "seed": 3},
    )
    rep = train_job(
        job, TrainOptions(schedule=sched, steps=4, out_dir=tmp_path / "run", progress=False)
    )
    torch.manual_seed(0)
    parts = build_model(n_stages=2, seq_len=job.seq_len, **job.model_args)
    assert parts.groups is not None
    n = sum(len(v) for v in parts.groups[1].values())
    frozen = {a["action"]: a["frozen"] for a in rep.actions if a["frozen"]}
    assert set(frozen) == {"1B0", "1B1"}
    for labels in frozen.values():  # e.g. ["blocks.2[5/8]", "blocks.3[6/12]"]
        k = 0
        for label in labels:
            name, _, part = label.partition("[")
            k += int(part.split("/")[0]) if part else len(parts.groups[1][name])
        assert k == math.floor(0.5 * n + 0.5)  # round half up
    assert rep.freezing_steps == 3 and all(math.isfinite(loss) for _, loss in rep.losses)


# --- schedules that do not fit ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "what"),
    [
        ({"microbatches": 8, "batch_size": 16}, "microbatches is 4 in the schedule but 8"),
        ({"schedule": "GPipe"}, "schedule is 1F1B in the schedule but GPipe"),
        ({"schedule": "Interleaved1F1B", "stages_per_rank": 2}, "schedule is 1F1B"),
        ({"ranks": 4}, "ranks is 2 in the schedule but 4"),
        ({"model_args": {**SMALL["model_args"], "n_layers": 8}}, "stage 0's group list"),
        ({"groups": {"all": ["*"]}}, "stage 0's group list"),
        # the same shape and group names at another width: the groups' fingerprints differ
        (
            {"model_args": {**SMALL["model_args"], "d_model": 16}},
            "the fingerprint (element count-hash of shapes and dtypes) of stage 0's group "
            "blocks.0 is",
        ),
    ],
)
def test_a_schedule_for_another_job_is_refused_before_training(
    tmp_path: Path, changes: dict[str, Any], what: str
) -> None:
    sched = write_schedule(tmp_path / "s.yaml", small_job(), {1: {"blocks.3": "0"}})
    with pytest.raises(MismatchError) as e:
        train_job(
            small_job(**changes),
            TrainOptions(schedule=sched, steps=3, out_dir=tmp_path / "run", progress=False),
        )
    msg = str(e.value)
    assert what in msg and "\n" not in msg and "freezeopt solve" in msg
    assert not (tmp_path / "run").exists()  # nothing started


NO_META = """
import torch
from torch import nn
from freezeopt.torchpp.job import ModelParts


def build(n_stages, seq_len, width=16):
    if torch.empty(0).is_meta:
        raise RuntimeError("this model does not build on the meta device")
    head = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 256))
    def loss_fn(logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
    return ModelParts(stages=[nn.Embedding(256, width), head], loss_fn=loss_fn)
"""


def test_the_ranks_check_the_fingerprints_of_a_model_the_meta_device_cannot_build(
    tmp_path: Path,
) -> None:
    """Where the parent cannot build the model on the meta device, each rank holds its real
    parameters to the schedule's fingerprints before the first step: the same one line, exit 4."""
    import importlib.util

    (tmp_path / "nometa.py").write_text(NO_META)
    spec = importlib.util.spec_from_file_location("nometa", tmp_path / "nometa.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    wide = mod.build(2, 16, width=16).stages
    data = yaml.safe_load(write_schedule(tmp_path / "base.yaml", small_job(), {}).read_text())
    data["pipeline"]["groups"] = [["params"], ["0", "2"]]
    data["pipeline"]["fingerprints"] = [
        [fingerprint(wide[0].parameters())],
        [fingerprint(wide[1][0].parameters()), fingerprint(wide[1][2].parameters())],
    ]
    sched = tmp_path / "s.yaml"
    sched.write_text(yaml.safe_dump(data))
    job = tmp_path / "job.yaml"
    narrow = {**SMALL, "name": "nometa", "model": "nometa:build", "model_args": {"width": 8}}
    job.write_text(yaml.safe_dump(narrow))
    with pytest.raises(MismatchError) as e:
        train_job(
            job, TrainOptions(schedule=sched, steps=2, out_dir=tmp_path / "run", progress=False)
        )
    msg = str(e.value)
    assert "\n" not in msg and "freezeopt profile" in msg, msg
    # both ranks refuse; whichever reports first is the one line
    if "stage 0's" in msg:
        assert "group params holds other parameters" in msg, msg
        assert f"{256 * 8}-" in msg and f"{256 * 16}-" in msg
    else:
        assert "rank 1: stage 1's group 0 holds other parameters" in msg, msg
        want = [fingerprint(wide[1][0].parameters()).split("-")[0]]
        assert f"{want[0]}-" in msg
    assert not (tmp_path / "run" / "report.json").exists()


def test_bad_options_are_refused(tmp_path: Path) -> None:
    """The library's errors name the option's field (the CLI says its flag: test_cli.py)."""
    job = small_job()
    with pytest.raises(InputError, match=r"without checkpoints\.resume to start"):
        train_job(
            job,
            TrainOptions(
                steps=3,
                out_dir=tmp_path / "none",
                progress=False,
                checkpoints=CheckpointOptions(resume=True),
            ),
        )
    with pytest.raises(InputError, match=r"^warmup_steps and full_update_every need schedule$"):
        TrainOptions(steps=3, out_dir=tmp_path / "x", phases=PhaseOverrides(warmup_steps=2))
    with pytest.raises(InputError, match="malformed"):
        train_job(
            job,
            TrainOptions(steps=3, out_dir=tmp_path / "x", fault="explode:step=1", progress=False),
        )


# --- a solved schedule on the built-in job: measured savings against the profile ---------------------

MED: dict[str, Any] = {
    **SMALL,
    "seq_len": 64,
    "measure_steps": 4,
    # a block's weight gradients take about 1 ms at d_model 128 (0.25 ms at 64, where the profile's
    # group costs moved 0.14–0.55 ms between runs and measured/predicted savings 0.33–2.7×; here
    # 0.93–1.54× in five runs), and the profile's default 20 leave-one-out rounds
    "cost_samples": 20,
    "lag_samples": 4,
    "model_args": {"d_model": 128, "n_heads": 2, "n_layers": 4, "mlp_ratio": 4},
}


@pytest.fixture(scope="module", params=["1F1B", "ZBVZeroBubble"])
def solved_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path, TrainReport]:
    """Profile → solve (budget 0.3) → train 20 steps, full-update steps interleaved (every 2)."""
    tmp = tmp_path_factory.mktemp(request.param)
    spr = 1 if request.param == "1F1B" else 2
    job = replace_job(load_job("tiny-gpt"), **MED, schedule=request.param, stages_per_rank=spr)
    profile_job(job, out=tmp / "p.json", progress=False)
    # this test compares costs, not step times: no step-time drift rule on a busy machine
    phases = Phases(drift=Drift(step_time_error=1e6))
    solve_file(
        tmp / "p.json", SolveOptions(mode="milp", budget=0.3), phases=phases, out=tmp / "s.yaml"
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=tmp / "s.yaml",
            steps=20,
            out_dir=tmp / "run",
            progress=False,
            phases=PhaseOverrides(warmup_steps=3, full_update_every=2),
        ),
    )
    return tmp / "p.json", tmp / "s.yaml", tmp / "run", rep


def load_plan_actions(prof: Any) -> list[list[str]]:
    return [list(rp.actions) for rp in prof.ranks]


def test_measured_savings_match_the_profiles_group_costs(
    solved_run: tuple[Path, Path, Path, TrainReport],
) -> None:
    """Per stage, the weight-gradient time the frozen actions saved (median full-update cost minus
    median freezing cost, thread-CPU) against what the profile's DAG says they save: the frozen
    groups' costs, and where a whole stage before is frozen too, what truncation saves.

    The band is wide on purpose: CPU noise at millisecond actions. On the first stage freezing a
    group also skips backpropagating below it, so leave-one-out costs are not additive there (the
    profile's docstring says so) and a stage-0 saving is only bounded by what its actions cost.
    It still fails when freezing skips nothing, or skips far more than the frozen groups' work.
    """
    prof_path, sched_path, _, rep = solved_run
    prof = load_profile(prof_path)
    dag = build_dag(prof)
    saved = dag.durations(schedule_plan(load_schedule(sched_path), dag))
    frozen = [a for a in rep.actions if a["frozen"]]
    assert frozen, "the solved schedule freezes something"
    assert rep.freezing_steps >= 6 and rep.full_steps >= 6
    # every action was timed in both kinds of step, under its own kind (I apart from B)
    assert [a["action"] for a in rep.actions] == [
        str(a) for acts in load_plan_actions(prof) for a in acts
    ]
    assert all(a["n_full"] >= 6 and a["n_freeze"] >= 6 for a in rep.actions)
    per_stage: dict[int, list[float]] = {}
    detail: dict[int, list[tuple]] = {}  # what a failure needs to be told from noise
    for a in frozen:
        act = parse_action(a["action"])
        s = act.stage
        predicted = dag.cost[act] - saved[act]
        measured = a["full_ms"] - a["freeze_ms"]
        acc = per_stage.setdefault(s, [0.0, 0.0, 0.0])
        acc[0] += measured
        acc[1] += predicted
        acc[2] += a["full_ms"]
        detail.setdefault(s, []).append(
            (a["action"], a["frozen"], a["full_ms"], a["freeze_ms"], a["n_full"], a["n_freeze"])
        )
    for s, (measured, predicted, whole) in per_stage.items():
        upper = whole + 0.2 if s == 0 else 2.5 * predicted + 0.2
        assert 0.5 * predicted - 0.2 <= measured <= upper, (
            s,
            measured,
            predicted,
            whole,
            detail[s],
        )
    unfrozen = [a for a in rep.actions if not a["frozen"] and a["action"][-2] in "BW"]
    for a in unfrozen:  # an action with nothing frozen costs the same in both kinds of step
        assert a["freeze_ms"] == pytest.approx(a["full_ms"], rel=0.5, abs=0.3), a


def test_simulate_draws_the_measured_steps(
    solved_run: tuple[Path, Path, Path, TrainReport], tmp_path: Path
) -> None:
    prof, sched, run, rep = solved_run
    png = tmp_path / "g.png"
    sim = simulate_files(sched, prof, gantt=png, measured=run / "actions.json")
    kinds = [m.kind for m in sim.measured]
    assert kinds == ["freeze", "full"]
    assert png.stat().st_size > 10_000
    freeze = sim.measured[0]
    assert set(freeze.timeline.start) == set(sim.dag.order)
    frozen_actions = {a["action"] for a in rep.actions if a["frozen"]}
    assert {str(a) for a, g in freeze.frozen.items() if g} == frozen_actions
    for acts in sim.dag.rank_actions:  # a rank ran its actions one after another
        for u, v in itertools.pairwise(acts):
            assert freeze.timeline.end[u] <= freeze.timeline.start[v] + 1e-6
    other = load_profile(prof)
    assert sim.dag.n_microbatches == other.pipeline.n_microbatches


# --- the command line -------------------------------------------------------------------------------


def test_cli_train_json_and_mismatch(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from freezeopt.cli import app

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "small", **SMALL}))
    sched = write_schedule(tmp_path / "s.yaml", small_job(), {1: {"blocks.3": "0-1"}}, warmup=2)
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        ["train", str(spec), "--schedule", str(sched), "--steps", "5", "--out-dir", str(out),
         "--json", "--no-progress"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    for key in ("step_ms", "predicted_step_ms", "loss", "val_loss", "fallbacks"):
        assert key in data
    assert data["predicted_step_ms"] == 9.0 and data["fallbacks"] == 0
    assert data["freezing_steps"] == 3 and data["full_steps"] == 1
    assert json.loads((out / "report.json").read_text()) == data
    # a run that measured no freezing step (e.g. a short resume): its step time is every
    # measured step's, and the report does not call it the freezing one
    text = format_train_report(dataclasses.replace(TrainReport(**data), freezing_steps=0))
    assert "step time      measured" in text and " (no freezing) predicted" in text
    assert "freezing     predicted" in format_train_report(TrainReport(**data))
    drift = {"step": 4, "event": "drift", "rules": ["loss_rise"], "loss": 3.227320075035095}
    text = format_train_report(TrainReport(**{**data, "events": [drift]}))
    assert "  step 4: drift (rules loss_rise, loss 3.227)" in text
    other = write_schedule(tmp_path / "o.yaml", small_job(microbatches=8, batch_size=16), {})
    r = CliRunner().invoke(app, ["train", str(spec), "--schedule", str(other), "--steps", "3"])
    assert r.exit_code == 4 and r.stderr.startswith("error: schedule") and r.stderr.count("\n") == 1


# --- the README's "your own training loop" example runs as written ------------------------------


class _Chunk(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


def _readme_worker(rank: int, port: int, code: str, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    chunks = [_Chunk(), _Chunk()]
    initial = {n: p.detach().clone() for n, p in chunks[rank].named_parameters()}
    stages = [PipelineStage(chunks[rank], rank, 2, torch.device("cpu"))]
    groups = {rank: [list(chunks[rank].a.parameters()), list(chunks[rank].b.parameters())]}
    optimizer = torch.optim.AdamW(chunks[rank].parameters(), lr=0.1)
    schedule = Schedule1F1B(stages[0], 4, loss_fn=lambda o, t: ((o - t) ** 2).mean())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)

    def run_pipeline_step(step: int) -> float:
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        t = torch.tensor([float(torch.stack(losses).mean()) if losses else 0.0])
        dist.all_reduce(t)
        return float(t)

    ns: dict[str, Any] = {
        "stages": stages,
        "groups": groups,
        "optimizer": optimizer,
        "steps": 3,
        "run_pipeline_step": run_pipeline_step,
    }
    exec(code, ns)
    after = {n: p.detach().clone() for n, p in chunks[rank].named_parameters()}
    torch.save({"initial": initial, "after": after, "phase": ns["ctrl"].phase}, f"{out}.{rank}")
    dist.destroy_process_group()


def test_the_readme_loop_example_runs(tmp_path: Path) -> None:
    import re
    import socket

    import torch.multiprocessing as mp

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Using it in your own training loop", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert code is not None
    sched = tmp_path / "s.yaml"
    data = yaml.safe_load(write_schedule(tmp_path / "base.yaml", small_job(), {}).read_text())
    data["pipeline"]["groups"] = [["a", "b"], ["a", "b"]]
    # _Chunk's groups: the README's enable_freezing has the controller check them
    data["pipeline"]["fingerprints"] = [[fingerprint(torch.nn.Linear(8, 8).parameters())] * 2] * 2
    data["frozen"] = {0: {"b": "0-1"}, 1: {"a": "0-3"}}  # stage 1's `a` in every microbatch
    sched.write_text(yaml.safe_dump(data))
    src = code.group(1).replace("schedules/my-job.yaml", str(sched))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = str(tmp_path / "res")
    mp.start_processes(_readme_worker, args=(port, src, out), nprocs=2, start_method="spawn")
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=False) for r in range(2))
    assert r0["phase"] == r1["phase"] == "freeze"
    for name, w in r1["after"].items():  # frozen in every microbatch: never moved
        assert torch.equal(w, r1["initial"][name]) == name.startswith("a."), name
    assert all(not torch.equal(w, r0["initial"][n]) for n, w in r0["after"].items())


def test_a_progression_freezes_a_growing_prefix_and_truncates_below_it(tmp_path: Path) -> None:
    """Composer's linear rule in a real run: the prefix grows by a group a step from step 2 (4
    groups over 8 steps from a quarter on), its groups get no gradient and stop moving, and the
    stage after a stage frozen whole truncates its backward there (its own groups still learn)."""
    job = small_job()
    sched = write_schedule(
        tmp_path / "s.yaml",
        job,
        {},
        progression={"kind": "linear", "start": 0.25, "level": 1.0, "total_steps": 8},
    )
    out = tmp_path / "run"
    train_job(job, TrainOptions(steps=8, out_dir=out, schedule=sched, progress=False))
    grown = [(e["step"], e["frozen_groups"]) for e in events(out) if e["event"] == "progression"]
    assert grown == [(4, 1), (5, 2), (7, 3)]  # floor(4·(t/8 − 1/4)/(3/4)): 1 at 4, 2 at 5, 3 at 7
    norms = {m["step"]: set(m["grad_norms"]) for m in metrics(out) if "grad_norms" in m}
    assert norms[2] == {"0/blocks.0", "0/blocks.1", "1/blocks.2", "1/blocks.3"}
    assert norms[5] == {"1/blocks.2", "1/blocks.3"}  # stage 0 frozen whole: no gradient there
    assert norms[7] == {"1/blocks.3"}
