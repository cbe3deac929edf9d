"""`init:` — a job that starts from a trained run's weights (fine-tuning): the parent pins the newest
intact checkpoint, every rank loads exactly its weights, and a checkpoint that does not fit the
model, is missing, damaged or the run's own is refused in one line before any rank starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from freezeopt.errors import InputError
from freezeopt.formats.profile import load_profile
from freezeopt.profiling.run import profile_job
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.torchpp.job import Job, load_job, replace_job, resolve_model
from freezeopt.torchpp.pipeline import plan_pipeline, preflight
from freezeopt.torchpp.weights import load_init, pin_init
from freezeopt.training.options import CheckpointOptions, TrainOptions
from freezeopt.training.train import train_job
from tests.training.test_train import small_job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder of 3 trained steps of the small job (its checkpoint at the end: step 3)."""
    out = tmp_path_factory.mktemp("pre") / "run"
    train_job(small_job(), TrainOptions(steps=3, out_dir=out, progress=False))
    return out


def _stages(job: Job) -> dict[int, torch.nn.Module]:
    """The job's stage modules as a rank builds them (seeded)."""
    torch.manual_seed(job.seed)
    parts = resolve_model(job)(n_stages=2, seq_len=job.seq_len, **job.model_args)
    return dict(enumerate(parts.stages))


def test_a_job_starts_from_the_runs_last_checkpoint(pretrained: Path) -> None:
    job = pin_init(small_job(init=str(pretrained)))
    newest = ckpt.latest_checkpoint(pretrained / "checkpoints")
    assert newest is not None and job.init == str(newest.path.resolve())
    plan = plan_pipeline(job)
    preflight(job, plan)  # checks the checkpoint against the model on the meta device
    mods = _stages(job)
    load_init(job, mods)
    saved = ckpt.load_rank_state(newest.path, 0)["model"][0]
    for name, t in mods[0].state_dict().items():
        assert torch.equal(t, saved[name]), name
    fresh = _stages(small_job())
    changed = [n for n, t in fresh[0].state_dict().items() if not torch.equal(t, saved[n])]
    assert changed  # three steps moved the weights away from the seeded initialisation


def test_a_profile_records_the_checkpoint_and_starts_where_the_run_ended(
    pretrained: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "ft.yaml"
    data = small_job().to_dict() | {"init": "../pre-link", "name": "ft"}
    spec.write_text(yaml.safe_dump(data))
    (tmp_path.parent / "pre-link").symlink_to(pretrained)  # relative to the job file's folder
    try:
        profile_job(spec, out=tmp_path / "p.json", progress=False)
    finally:
        (tmp_path.parent / "pre-link").unlink()
    tuned = load_profile(tmp_path / "p.json")
    job = tuned.provenance.job
    assert job is not None and job["init"].endswith("step-00000003")
    # the pretrained model starts lower than a fresh one on the same data
    profile_job(small_job(), out=tmp_path / "q.json", progress=False)
    fresh = load_profile(tmp_path / "q.json")
    assert tuned.val_loss[0] < fresh.val_loss[0]


def test_init_that_does_not_fit_is_one_line_before_any_rank(
    pretrained: Path, tmp_path: Path
) -> None:
    cases = {
        "no run folder or checkpoint": small_job(init=str(tmp_path / "absent")),
        "holds no checkpoint": small_job(init=str(tmp_path)),
        "is \\(32, 256\\)|is \\(256, 32\\)|lacks|unknown": small_job(
            init=str(pretrained),
            model_args={"d_model": 48, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        ),
        "holds stages 0, 1 but this job has stages 0, 1, 2, 3": small_job(
            init=str(pretrained), stages_per_rank=2, schedule="Interleaved1F1B"
        ),
    }
    for said, job in cases.items():
        with pytest.raises(InputError, match=said) as e:
            profile_job(job, out=tmp_path / "p.json", progress=False)
        assert "\n" not in str(e.value)
        assert not (tmp_path / "p.json").exists()


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(
    pretrained: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pretrained, run)
    newest = ckpt.latest_checkpoint(run / "checkpoints")
    assert newest is not None
    older = newest.path.parent / "step-00000001"
    shutil.copytree(newest.path, older)  # an older intact checkpoint (same files: checksums hold)
    (newest.path / "rank1.pt").write_bytes(b"damaged")
    assert pin_init(small_job(init=str(run))).init == str(older.resolve())
    with pytest.raises(InputError, match="corrupted"):
        pin_init(small_job(init=str(newest.path)))


def test_a_run_may_not_start_from_its_own_folder(pretrained: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(pretrained, run)
    with pytest.raises(InputError, match="own folder"):
        train_job(
            small_job(init=str(run)),
            TrainOptions(steps=2, out_dir=run, overwrite=True, progress=False),
        )
    assert ckpt.latest_checkpoint(run / "checkpoints") is not None  # nothing was deleted


def test_init_paths_in_a_job_file(tmp_path: Path) -> None:
    spec = tmp_path / "j.yaml"
    spec.write_text(yaml.safe_dump(small_job().to_dict() | {"init": "runs/pre"}))
    assert load_job(spec).init == str(tmp_path / "runs" / "pre")
    spec.write_text(yaml.safe_dump(small_job().to_dict() | {"init": "~/x"}))
    assert load_job(spec).init == str(Path.home() / "x")
    with pytest.raises(InputError):
        replace_job(small_job(), init="")


def test_a_resumed_fine_tuning_keeps_the_checkpoint_it_started_from(
    pretrained: Path, tmp_path: Path
) -> None:
    """The pretraining run moves on (a newer checkpoint) after the fine-tuning run started: its
    resume still matches and continues, from its own checkpoint, not the newer weights."""
    pre = tmp_path / "pre"
    shutil.copytree(pretrained, pre)
    out = tmp_path / "ft"
    train_job(small_job(init=str(pre)), TrainOptions(steps=2, out_dir=out, progress=False))
    started = ckpt.latest_checkpoint(pre / "checkpoints")
    assert started is not None
    shutil.copytree(started.path, started.path.parent / "step-00000009")  # the run went on
    rep = train_job(
        small_job(init=str(pre)),
        TrainOptions(
            steps=4, out_dir=out, progress=False, checkpoints=CheckpointOptions(resume=True)
        ),
    )
    assert rep.start_step == 2
    meta = ckpt.latest_checkpoint(out / "checkpoints")
    assert meta is not None and meta.meta["job"]["init"] == str(started.path.resolve())
