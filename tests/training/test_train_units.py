"""The parts of `freezeopt train` that need no processes: faults, checkpoints, the action log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from freezeopt.errors import InputError, MismatchError
from freezeopt.model.dag import build_dag
from freezeopt.model.timelines import load_action_log
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.torchpp.faults import Fault, parse_faults
from tests.conftest import make_profile


def test_faults_parse() -> None:
    assert parse_faults("") == ()
    got = parse_faults("lr_spike:step=12; slow:stage=1,ms=2.5,step=3;crash:rank=1,step=7")
    assert got == (
        Fault(kind="lr_spike", step=12, factor=100.0),
        Fault(kind="slow", stage=1, ms=2.5, step=3),
        Fault(kind="crash", rank=1, step=7),
    )
    assert parse_faults("corrupt_batch:step=4")[0].kind == "corrupt_batch"
    assert parse_faults("corrupt_batch:step=4,steps=3")[0].steps == 3
    assert parse_faults("lr_spike:step=1,factor=1000")[0].factor == 1000.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("boom:step=1", "malformed"),
        ("lr_spike", "malformed"),
        ("lr_spike:factor=3", "missing 'step'"),
        ("slow:stage=1", "missing 'ms'"),
        ("crash:rank=1,step=2,when=3", "unknown 'when'"),
        ("corrupt_batch:step=x", "not key=number"),
        ("corrupt_batch:step", "not key=number"),
        ("slow:stage=-1,ms=3", "negative"),
    ],
)
def test_bad_faults(text: str, why: str) -> None:
    with pytest.raises(InputError, match=why) as e:
        parse_faults(text)
    assert "\n" not in str(e.value)


def test_checkpoints_are_complete_only_with_meta_and_pruned(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (2, 5, 9):
        digests = {
            rank: ckpt.save_rank_state(
                root, step, rank, {"step": step, "w": torch.full((2,), step)}
            )[1]
            for rank in range(2)
        }
        ckpt.write_meta(root, step, {"job": {"lr": 0.1}}, digests)
    ckpt.save_rank_state(root, 11, 0, {"step": 11})  # a crash before rank 1 and the meta
    assert [c.step for c in ckpt.find_checkpoints(root)] == [2, 5, 9]
    last = ckpt.latest_checkpoint(root)
    assert last is not None and last.step == 9 and last.meta["job"] == {"lr": 0.1}
    assert torch.equal(ckpt.load_rank_state(last.path, 1)["w"], torch.full((2,), 9))
    assert not list(last.path.glob("*.tmp"))  # written through a temporary file and a rename
    umask = os.umask(0o022)
    try:
        new, _ = ckpt.save_rank_state(tmp_path / "elsewhere", 1, 0, {"step": 1})
        assert new.stat().st_mode & 0o777 == 0o644, "the umask's mode, not mkstemp's 0600"
    finally:
        os.umask(umask)
    removed = ckpt.prune_checkpoints(root, keep=2)
    assert [p.name for p in removed] == ["step-00000002"]
    assert sorted(p.name for p in root.iterdir()) == [
        "step-00000005",
        "step-00000009",
        "step-00000011",  # newer than the last complete one: might still be being written
    ]
    ckpt.check_meta(last, {"job": {"lr": 0.1}})
    with pytest.raises(MismatchError, match=r"another job setting, lr \(0\.1 there, 0\.2 now\)"):
        ckpt.check_meta(last, {"job": {"lr": 0.2}})
    with pytest.raises(MismatchError, match=r"another job setting, seed \(no value there, 9 now\)"):
        ckpt.check_meta(last, {"job": {"lr": 0.1, "seed": 9}})
    # a field the checkpoint lacks, now None (a job field added since, say)
    with pytest.raises(MismatchError, match=r"another job setting, extra \(no value there, None"):
        ckpt.check_meta(last, {"job": {"lr": 0.1, "extra": None}})
    # the schedule's hash covers the phase overrides, which a resume without them changes
    with pytest.raises(MismatchError, match=r"another schedule sha256 \(the schedule file with "):
        ckpt.check_meta(last, {"schedule_sha256": "abc"})
    with pytest.raises(InputError, match="no state for rank 3"):
        ckpt.load_rank_state(last.path, 3)


def _three_checkpoints(root: Path) -> None:
    for step in (2, 5, 9):
        digests = {
            rank: ckpt.save_rank_state(root, step, rank, {"w": torch.full((64,), float(step))})[1]
            for rank in range(2)
        }
        ckpt.write_meta(root, step, {}, digests)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "no_checksum"])
def test_a_damaged_checkpoint_is_detected_and_the_previous_one_used(
    tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "checkpoints"
    _three_checkpoints(root)
    good, bad = ckpt.good_checkpoints(root, range(2))
    assert [c.step for c in good] == [2, 5, 9] and bad == []
    f = root / "step-00000009" / "rank1.pt"
    if damage == "flip":  # one bit of the payload: torch may still load it, the checksum does not
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
        expected = "is corrupted"
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:100])
        expected = "is corrupted"
    elif damage == "delete":
        f.unlink()
        expected = "cannot read"
    else:
        meta = root / "step-00000009" / "meta.json"
        doc = json.loads(meta.read_text())
        del doc["sha256"]
        meta.write_text(json.dumps(doc))
        expected = "records no checksum for rank"
    good, bad = ckpt.good_checkpoints(root, range(2))
    assert [c.step for c in good] == [2, 5]
    assert [c.step for c, _ in bad] == [9] and expected in bad[0][1], bad
    if damage != "no_checksum":
        assert "rank1.pt" in bad[0][1] and ckpt.verify_rank_file(bad[0][0], 0) is None


def _log(profile, **changes) -> dict:
    timeline = []
    for rp in profile.ranks:
        t = 0.0
        for a in rp.actions:
            timeline.append(
                {"action": a, "rank": rp.rank, "start_ms": t, "end_ms": t + 1, "frozen": []}
            )
            t += 1.5
    doc = {
        "format": "freezeopt-actions",
        "version": 1,
        "schedule": profile.pipeline.schedule,
        "world_size": profile.pipeline.world_size,
        "n_stages": profile.pipeline.n_stages,
        "n_microbatches": profile.pipeline.n_microbatches,
        "freeze": {"step": 7, "step_ms": t, "timeline": timeline},
        "full": None,
    }
    doc.update(changes)
    return doc


def test_action_log_is_read_and_checked(tmp_path: Path) -> None:
    profile = make_profile()
    dag = build_dag(profile)
    path = tmp_path / "actions.json"
    path.write_text(json.dumps(_log(profile)))
    (m,) = load_action_log(path, dag, schedule="1F1B")
    assert m.kind == "freeze" and m.step == 7 and set(m.timeline.start) == set(dag.order)
    path.write_text(json.dumps(_log(profile, n_microbatches=8)))
    with pytest.raises(MismatchError, match="8 microbatches"):
        load_action_log(path, dag, schedule="1F1B")
    doc = _log(profile)
    doc["freeze"]["timeline"] = doc["freeze"]["timeline"][1:]
    path.write_text(json.dumps(doc))
    with pytest.raises(MismatchError, match="exactly the profile's actions"):
        load_action_log(path, dag, schedule="1F1B")
    for start, end in (
        (0.0, float("inf")),
        (-1.0, 2.0),
        (3.0, 2.0),
        (float("nan"), 1.0),
        (0, 1e300),
    ):
        doc = _log(profile)
        doc["freeze"]["timeline"][0].update(start_ms=start, end_ms=end)
        path.write_text(json.dumps(doc))
        with pytest.raises(InputError, match="times are finite, non-negative"):
            load_action_log(path, dag, schedule="1F1B")
    doc = _log(profile)
    doc["freeze"]["step"] = float("inf")  # `1e999` in the file: int() of it overflowed
    path.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    with pytest.raises(InputError, match="malformed 'freeze' section"):
        load_action_log(path, dag, schedule="1F1B")
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="not a freezeopt action log"):
        load_action_log(path, dag, schedule="1F1B")
    with pytest.raises(InputError, match="not found"):
        load_action_log(tmp_path / "nope.json", dag, schedule="1F1B")
    with pytest.raises(InputError, match=r"is a folder; pass RUN_DIR/actions\.json"):
        load_action_log(tmp_path, dag, schedule="1F1B")


def test_a_fresh_run_clears_only_the_run_files_and_says_when_checkpoints_went(
    tmp_path: Path,
) -> None:
    from freezeopt.training.train import _clear_run

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "events.jsonl").write_text("{}\n")
    assert _clear_run(tmp_path) is False  # no checkpoints: nothing worth a warning
    (tmp_path / "checkpoints" / "step-00000002").mkdir(parents=True)
    assert _clear_run(tmp_path) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_profile_without_re_planning_is_said_to_be_unused() -> None:
    from freezeopt.training.options import ReplanOptions
    from freezeopt.training.train import _replan_spec

    warnings: list[str] = []
    off = _replan_spec(None, ReplanOptions(profile=Path("p.json")), warnings=warnings)
    assert off is None and warnings == [
        "--profile is read only for online re-planning and the tracked Gantt chart; "
        "without --replan-every, --replan-on-drift, --adaptive, --mlflow or --tensorboard it "
        "was not used"
    ]
    tracked: list[str] = []  # a tracked run draws its Gantt chart from the profile
    _replan_spec(None, ReplanOptions(profile=Path("p.json")), warnings=tracked, for_gantt=True)
    assert tracked == []
