"""Where a job's weights start: a trained run's checkpoint (`init:`), for fine-tuning.

A job normally starts from its model function's initialisation (seeded). With `init:` it starts
from the model chunks of a checkpoint `freezeopt train` wrote: pretrain with one job, fine-tune
with another that names the first one's run folder. The parent pins the checkpoint before any
rank starts (`pin_init`: a run folder becomes its newest checkpoint whose files match their
checksums, so every rank loads the same one, and the job records which) and checks it against
the model built on the meta device (`check_init`: the same stages, parameter names and shapes);
each rank then loads its stages weights-only (`load_init`), strictly: a checkpoint of another
model is refused, never half-loaded. Only the weights carry over; the optimizer starts afresh, as
fine-tuning does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freezeopt.errors import InputError
from freezeopt.torchpp import checkpoint as ckpt
from freezeopt.torchpp.job import Job

__all__ = ["check_init", "init_states", "load_init", "pin_init"]

_HINT = "train the run it names first (freezeopt train JOB --out-dir RUN), or fix the path"


def pin_init(job: Job) -> Job:
    """`job` with `init` naming one checkpoint folder: a run folder's newest intact checkpoint
    (checksums verified), or the checkpoint folder given. Unchanged without `init`."""
    if job.init is None:
        return job
    path = Path(job.init)
    if not path.is_dir():
        raise InputError(f"init: no run folder or checkpoint at {path}; {_HINT}")
    if (path / ckpt.META).is_file():
        found = [c for c in ckpt.find_checkpoints(path.parent) if c.path == path]
        if not found:
            raise InputError(f"init: {path} is not a complete checkpoint; {_HINT}")
        chosen = found[0]
        ranks = _ranks(chosen)
        why = next((w for r in ranks if (w := ckpt.verify_rank_file(chosen, r)) is not None), None)
        if why is not None:
            raise InputError(f"init: {why}; name another checkpoint")
    else:
        root = path / "checkpoints"
        every = ckpt.find_checkpoints(root)
        if not every:
            raise InputError(f"init: {path} holds no checkpoint; {_HINT}")
        good, bad = ckpt.good_checkpoints(root, _ranks(every[-1]))
        if not good:
            raise InputError(f"init: no intact checkpoint in {root} ({bad[-1][1]}); {_HINT}")
        chosen = good[-1]
    return dataclasses.replace(job, init=str(chosen.path.resolve()))


def _ranks(c: ckpt.Checkpoint) -> range:
    world = c.meta.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise InputError(
            f"init: {c.path / ckpt.META} records no world_size; name another checkpoint"
        )
    return range(world)


def init_states(folder: str | Path) -> dict[int, dict[str, Any]]:
    """Stage → its state dict, from every rank file of a pinned checkpoint folder (read
    weights-only and memory-mapped: nothing is copied until a stage loads it)."""
    import torch

    meta = next(
        (c for c in ckpt.find_checkpoints(Path(folder).parent) if c.path == Path(folder)), None
    )
    if meta is None:
        raise InputError(f"init: {folder} is not a complete checkpoint; {_HINT}")
    out: dict[int, dict[str, Any]] = {}
    for r in _ranks(meta):
        f = Path(folder) / f"rank{r}.pt"
        try:
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # torch raises many kinds for a damaged or hostile file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(
                f"init: cannot read {f} ({first[:200]}); name another checkpoint"
            ) from None
        model = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model, dict):
            raise InputError(f"init: {f} holds no model chunks; name another checkpoint")
        for s, sd in model.items():
            out[int(s)] = sd
    return out


def check_init(job: Job, stages: Mapping[int, Any]) -> None:
    """Raise InputError unless the pinned checkpoint holds exactly `stages`' state (modules, or
    modules on the meta device): the same stage indices, names and shapes."""
    if job.init is None:
        return
    states = init_states(job.init)
    if sorted(states) != sorted(stages):
        raise InputError(
            f"init: {job.init} holds stages {_list(states)} but this job has stages "
            f"{_list(stages)}; fine-tune with the pipeline split the run was trained with"
        )
    for s, mod in stages.items():
        _match(s, mod.state_dict(), states[s], job.init)


def load_init(job: Job, mods: Mapping[int, Any]) -> None:
    """Load the pinned checkpoint's weights into this rank's stage modules `mods` (strict)."""
    if job.init is None:
        return
    states = init_states(job.init)
    for s, mod in mods.items():
        if s not in states:
            raise InputError(f"init: {job.init} holds no stage {s}; {_HINT}")
        _match(s, mod.state_dict(), states[s], job.init)
        mod.load_state_dict(states[s], strict=True)


def _match(stage: int, have: Mapping[str, Any], got: Mapping[str, Any], where: str) -> None:
    missing = sorted(set(have) - set(got))
    extra = sorted(set(got) - set(have))
    if missing or extra:
        name, side = (missing[0], "lacks") if missing else (extra[0], "has an unknown")
        raise InputError(
            f"init: stage {stage} of {where} {side} {name!r}; it was trained for another model "
            "(fine-tune the model the run trained)"
        )
    for k, v in have.items():
        if tuple(v.shape) != tuple(got[k].shape):
            raise InputError(
                f"init: stage {stage}'s {k!r} is {tuple(got[k].shape)} in {where} but "
                f"{tuple(v.shape)} in this model; fine-tune the model the run trained"
            )


def _list(xs: Any) -> str:
    return ", ".join(str(x) for x in sorted(xs)) or "none"
