"""Skipping frozen groups on stock torch pipelining: real 2-rank runs (gloo, CPU), exact gradients.

One spawn per schedule runs six variants on identical models and data: torch unpatched, patched
with nothing frozen, group 0 frozen in every microbatch, group 0 frozen in the even microbatches
(gradient rescaled by M/(M−k)), and stage 0 frozen whole in the even microbatches without and
with backward truncation (stage 1 then computes no input gradient there). They are checked
against gradients computed in this process without any pipeline, and truncation against the
untruncated backward bit for bit.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from freezeopt.torchpp.adapter import enable_freezing, scale_group_grads

D, M, MB_ROWS = 16, 4, 3
MODES = ("stock", "zero", "all0", "even0", "whole0", "whole0cut")


class Chunk(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(D, D)
        self.b = torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


def _chunks(n: int) -> list[Chunk]:
    torch.manual_seed(0)
    return [Chunk() for _ in range(n)]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(M * MB_ROWS, D, generator=g), torch.randn(M * MB_ROWS, D, generator=g)


def _loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return ((y - t) ** 2).mean()


def _frozen_fn(mode: str):
    if mode.startswith("whole0"):  # stage 0 frozen whole in the even microbatches
        return lambda s, m: frozenset({0, 1}) if s == 0 and m % 2 == 0 else frozenset()
    if mode == "all0":
        return lambda s, m: frozenset({0})
    if mode == "even0":
        return lambda s, m: frozenset({0}) if m % 2 == 0 else frozenset()
    return lambda s, m: frozenset()


def _worker(rank: int, world: int, port: int, schedule: str, out: str) -> None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    multi = schedule not in ("1F1B", "GPipe")
    n_stages = world * (2 if multi else 1)
    mine = (
        ([rank, 2 * world - 1 - rank] if "ZBV" in schedule else [rank, rank + world])
        if multi
        else [rank]
    )
    x, y = _data()
    results = {}
    for mode in MODES:
        chunks = _chunks(n_stages)
        stages, groups = [], {}
        input_grads = dict.fromkeys(mine, 0)  # how many input gradients each stage computed
        for s in mine:

            def count(mod, args, s=s, seen=input_grads):
                if args[0].requires_grad:
                    args[0].register_hook(lambda g: seen.__setitem__(s, seen[s] + 1))

            chunks[s].register_forward_pre_hook(count)
            st = PipelineStage(chunks[s], s, n_stages, torch.device("cpu"))
            groups[s] = [list(chunks[s].a.parameters()), list(chunks[s].b.parameters())]
            if mode == "whole0cut":  # stage 1 needs no input gradient where stage 0 is frozen
                enable_freezing(
                    st, groups[s], _frozen_fn(mode), lambda s, m: not (s == 1 and m % 2 == 0)
                )
            elif mode != "stock":
                enable_freezing(st, groups[s], _frozen_fn(mode))
            stages.append(st)
        sched = get_schedule_class(schedule)(stages if multi else stages[0], M, loss_fn=_loss)
        opt = torch.optim.AdamW([p for s in mine for p in chunks[s].parameters()], lr=0.1)
        opt.zero_grad(set_to_none=True)
        args = (x,) if 0 in mine else ()
        kwargs = {"target": y, "losses": []} if n_stages - 1 in mine else {}
        sched.step(*args, **kwargs)
        for s in mine:
            if mode == "all0":
                scale_group_grads(groups[s], {0: None})
            elif mode == "even0":
                scale_group_grads(groups[s], {0: M / (M - M // 2)})
            elif mode.startswith("whole0") and s == 0:
                scale_group_grads(groups[s], {0: M / (M - M // 2), 1: M / (M - M // 2)})
        grads = {
            s: {
                n: None if p.grad is None else p.grad.clone()
                for n, p in chunks[s].named_parameters()
            }
            for s in mine
        }
        opt.step()
        params = {s: {n: p.detach().clone() for n, p in chunks[s].named_parameters()} for s in mine}
        state = {
            s: {n: bool(opt.state.get(p)) for n, p in chunks[s].named_parameters()} for s in mine
        }
        results[mode] = {"grads": grads, "params": params, "state": state, "inputs": input_grads}
        dist.barrier()
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def _reference(n_stages: int, mbs: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Mean over `mbs` of per-microbatch gradients, computed without a pipeline."""
    chunks = _chunks(n_stages)
    x, y = _data()
    for m in mbs:
        h = x[m * MB_ROWS : (m + 1) * MB_ROWS]
        for c in chunks:
            h = c(h)
        (_loss(h, y[m * MB_ROWS : (m + 1) * MB_ROWS]) / len(mbs)).backward()
    return {s: {n: p.grad.clone() for n, p in c.named_parameters()} for s, c in enumerate(chunks)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"])
def test_freezing_on_stock_torch(tmp_path: Path, schedule: str) -> None:
    out = str(tmp_path / "res")
    mp.start_processes(
        _worker, args=(2, _free_port(), schedule, out), nprocs=2, start_method="spawn"
    )
    res = {}
    for r in range(2):
        for mode, data in torch.load(f"{out}.{r}").items():
            for key in ("grads", "params", "state", "inputs"):
                res.setdefault(mode, {}).setdefault(key, {}).update(data[key])
    n_stages = len(res["stock"]["grads"])
    # truncation where stage 1's backward runs whole (1F1B): no input gradient in the even
    # microbatches; split backwards (the zero-bubble schedules) compute it as before
    cut = M // 2 if schedule == "1F1B" else 0
    assert res["whole0cut"]["inputs"][1] == res["whole0"]["inputs"][1] - cut
    assert res["whole0"]["inputs"][1] >= M  # one per microbatch (torch adds one of its own)
    full = _reference(n_stages, list(range(M)))
    odd = _reference(n_stages, [m for m in range(M) if m % 2])
    for s in range(n_stages):
        for name, g in res["stock"]["grads"][s].items():
            assert torch.allclose(g, full[s][name], atol=1e-6), (s, name)
            # nothing frozen: bit-identical to torch's own code path, gradients and updated weights
            assert torch.equal(res["zero"]["grads"][s][name], g)
            assert torch.equal(res["zero"]["params"][s][name], res["stock"]["params"][s][name])
            in_group0 = name.startswith("a.")
            # frozen everywhere: grad None, weights unchanged, no optimizer state
            if in_group0:
                assert res["all0"]["grads"][s][name] is None
                assert not res["all0"]["state"][s][name]
                init = dict(_chunks(n_stages)[s].named_parameters())[name]
                assert torch.equal(res["all0"]["params"][s][name], init.detach())
            else:
                assert torch.allclose(res["all0"]["grads"][s][name], g, atol=1e-6)
            # frozen in the even microbatches, rescaled: the mean over the odd ones
            want = odd[s][name] if in_group0 else g
            assert torch.allclose(res["even0"]["grads"][s][name], want, atol=1e-6), (s, name)
            # stage 0 frozen whole in the even microbatches: its gradients the odd ones' mean, the
            # others' untouched; truncating stage 1's backward there changes no gradient at all
            want = odd[s][name] if s == 0 else g
            assert torch.allclose(res["whole0"]["grads"][s][name], want, atol=1e-6), (s, name)
            assert torch.equal(res["whole0cut"]["grads"][s][name], res["whole0"]["grads"][s][name])


def test_fsdp_and_ddp_stages_are_refused_fsdp2_ones_taken() -> None:
    """FSDP (version 1) and DDP reduce a stage's gradients in hooks a restricted backward does not
    drive: `enable_freezing` refuses them in one line. FSDP2 is taken (exact: test_fsdp2.py), but
    freezeopt's own jobs, which shard nothing, still want plain stage modules. Run in a process of
    its own (a one-rank gloo group)."""
    import subprocess
    import sys

    code = """
import os, types, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300))
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.fsdp import fully_shard
from freezeopt.errors import InputError
from freezeopt.torchpp.adapter import enable_freezing, wrapped_by
plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
fsdp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
fully_shard(fsdp[0])
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))
print(wrapped_by(plain), wrapped_by(fsdp), wrapped_by(ddp))
for mod in (fsdp, ddp):
    stage = types.SimpleNamespace(submod=mod, stage_index=1, backward_one_chunk=print,
                                  backward_weight_one_chunk=print, backward_maybe_with_nosync=print)
    try:
        enable_freezing(stage, [[]], lambda s, m: frozenset())
        print("taken:", stage.backward_maybe_with_nosync is not print)
    except InputError as e:
        print("refused:", e)
dist.destroy_process_group()
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "None FSDP2 (fully_shard) DDP"
    assert lines[1] == "taken: True"
    assert lines[2].startswith("refused: stage 1's module is wrapped by DDP:")
    assert "FSDP2 (fully_shard) instead" in lines[2]


def test_enable_freezing_has_the_controller_check_the_groups() -> None:
    """Given a controller's `frozen_groups`, `enable_freezing` holds the groups to the schedule's
    fingerprints before it patches anything: a schedule solved at width 16 refuses a stage of
    width 8 (same group names) in one line, and the stage stays stock."""
    import dataclasses
    import types

    from freezeopt.errors import MismatchError
    from freezeopt.formats.fingerprint import fingerprint
    from freezeopt.formats.profile import profile_sha256
    from freezeopt.formats.schedule import Phases
    from freezeopt.model.dag import build_dag
    from freezeopt.model.sensitivity import estimate_signal
    from freezeopt.solver import SolveOptions, schedule_from_result, solve
    from freezeopt.training.runtime import FreezeController
    from tests.conftest import make_profile

    def stage(width: int) -> tuple[types.SimpleNamespace, list[list[torch.nn.Parameter]]]:
        mod = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
        st = types.SimpleNamespace(
            submod=mod,
            stage_index=0,
            backward_one_chunk=lambda *a, **k: None,
            backward_weight_one_chunk=lambda *a, **k: None,
            backward_maybe_with_nosync=lambda *a, **k: None,
        )
        return st, [list(mod[0].parameters()), list(mod[1].parameters())]

    profile = make_profile()  # 2 groups a stage, s0.g0 and s0.g1 on stage 0
    opts = SolveOptions(mode="heuristic", budget=0.5)
    dag = build_dag(profile)
    base = schedule_from_result(
        solve(dag, estimate_signal(profile), opts),
        profile=profile,
        profile_sha256=profile_sha256(profile),
        dag=dag,
        opts=opts,
        phases=Phases(),
    )
    _, wide = stage(16)
    fps = tuple(tuple(fingerprint(g) for g in wide) for _ in base.pipeline.groups)
    sched = dataclasses.replace(base, pipeline=dataclasses.replace(base.pipeline, fingerprints=fps))
    ctrl = FreezeController(sched, stages=[0])
    narrow_stage, narrow = stage(8)
    stock = narrow_stage.backward_maybe_with_nosync
    with pytest.raises(MismatchError, match=r"^stage 0's group s0\.g0 holds other parameters") as e:
        enable_freezing(narrow_stage, narrow, ctrl.frozen_groups)
    assert "\n" not in str(e.value)
    assert narrow_stage.backward_maybe_with_nosync is stock  # nothing patched
    wide_stage, wide = stage(16)
    wide_stock = wide_stage.backward_maybe_with_nosync
    enable_freezing(wide_stage, wide, ctrl.frozen_groups)
    assert wide_stage.backward_maybe_with_nosync is not wide_stock  # patched
    # another callable: the caller's own business (freezeopt train checks its groups itself)
    enable_freezing(narrow_stage, narrow, lambda s, m: ctrl.frozen_groups(s, m))
