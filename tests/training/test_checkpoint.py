"""Checkpoints read as untrusted files: weights-only loading (no code runs from a rank file whose
checksum was recomputed), a malformed meta.json is no traceback, a resume falls back past a
checkpoint that matches its checksums but does not load; and a fresh run never deletes an
earlier one without being told to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from freezeopt.cli import app
from freezeopt.errors import InputError
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.training.options import CheckpointOptions, TrainOptions
from freezeopt.training.train import train_job
from tests.training.test_train import small_job

MARK = Path("/tmp/freezeopt-checkpoint-ran-code")


class Evil:
    """Unpickling this runs code: it writes MARK."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (MARK.write_text, ("ran",))


def _checkpoint(root: Path, step: int, states: dict[int, object]) -> ckpt.Checkpoint:
    """A complete checkpoint of `states` (rank → object saved with torch.save), checksums right."""
    digests = {}
    for r, state in states.items():
        f = ckpt.checkpoint_dir(root, step) / f"rank{r}.pt"
        f.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, f)
        digests[r] = ckpt.file_sha256(f)
    ckpt.write_meta(root, step, {"job": {}}, digests)
    return next(c for c in ckpt.find_checkpoints(root) if c.step == step)


def test_a_rank_file_that_would_run_code_is_refused_not_run(tmp_path: Path) -> None:
    MARK.unlink(missing_ok=True)
    c = _checkpoint(tmp_path, 4, {0: {"model": Evil()}})
    assert ckpt.verify_rank_file(c, 0) is None  # the checksum matches: anyone can recompute it
    with pytest.raises(InputError, match=r"cannot read checkpoint .*rank0\.pt"):
        ckpt.load_rank_state(c.path, 0)
    why = ckpt.unreadable(c, [0])
    assert why is not None and "does not load weights-only" in why
    assert not MARK.exists()


def test_resume_falls_back_past_a_checkpoint_that_does_not_load(tmp_path: Path) -> None:
    state = {"step": 2, "model": {"w": torch.ones(3)}, "rng": torch.get_rng_state()}
    old = _checkpoint(tmp_path, 2, {0: state, 1: state})
    new = _checkpoint(tmp_path, 4, {0: state, 1: {"x": Evil()}})
    good, bad = ckpt.resume_candidates(tmp_path, range(2))
    assert [c.step for c in good] == [old.step]
    assert [(c.step, "rank1.pt" in why) for c, why in bad] == [(new.step, True)]
    assert ckpt.load_rank_state(old.path, 1)["step"] == 2


@pytest.mark.parametrize("meta", ["[]", '"text"', '{"sha256": []}', '{"sha256": {"0": 5}}', "{"])
def test_a_malformed_meta_json_is_skipped_or_named_never_a_traceback(
    tmp_path: Path, meta: str
) -> None:
    c = _checkpoint(tmp_path, 6, {0: {"step": 6}})
    (c.path / ckpt.META).write_text(meta)
    found = ckpt.find_checkpoints(tmp_path)
    good, bad = ckpt.good_checkpoints(tmp_path, [0])
    assert good == []
    assert len(found) == len(bad) <= 1  # not a checkpoint at all, or one named as bad
    for _, why in bad:
        assert "records no checksum for rank 0" in why


def test_a_fresh_run_refuses_a_folder_holding_an_earlier_run(tmp_path: Path) -> None:
    """Nothing an earlier run wrote is deleted unless the run is told to (`overwrite`); the
    command line names the flags that decide."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(InputError, match="holds an earlier run") as e:
        train_job(small_job(), TrainOptions(steps=2, out_dir=run, progress=False))
    assert "pass checkpoints.resume to continue it, overwrite to replace it" in str(e.value)
    assert (run / "metrics.jsonl").exists() and (run / "checkpoints" / "step-00000004").is_dir()
    r = CliRunner().invoke(app, ["train", "tiny-gpt", "--steps", "2", "--out-dir", str(run)])
    assert r.exit_code == 2
    assert r.stderr == (
        f"error: {run} holds an earlier run (metrics.jsonl, checkpoints); pass --resume to "
        "continue it, --overwrite to replace it, or another --out-dir\n"
    )
    assert (run / "metrics.jsonl").exists()
    with pytest.raises(InputError, match="contradict"):
        TrainOptions(
            steps=2, out_dir=run, overwrite=True, checkpoints=CheckpointOptions(resume=True)
        )
