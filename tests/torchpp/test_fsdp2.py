"""Freezing under FSDP2 (`fully_shard`): real pipelined runs on gloo (CPU), exact gradients.

Each pipeline stage is sharded as torchtitan shards it (every block, then the stage module) over a
data-parallel mesh of 1 or 2 ranks. Six variants run on identical models and data — torch
unpatched, patched with nothing frozen, group 0 frozen in every microbatch, group 0 frozen in the
even microbatches (rescaled by M/(M−k)), stage 0 frozen whole in the even microbatches without and
with backward truncation — and their reduced (sharded) gradients are checked against gradients
computed in this process without pipeline or sharding: trainable groups get exactly what the
unfrozen run gets, a group frozen everywhere gets none.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from freezeopt.torchpp.adapter import enable_freezing, scale_group_grads

from .test_freezing import MB_ROWS, MODES, D, M, _chunks, _free_port, _frozen_fn, _loss

STAGES = 2


def _data(replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1 + replica)
    return torch.randn(M * MB_ROWS, D, generator=g), torch.randn(M * MB_ROWS, D, generator=g)


def _worker(rank: int, dp: int, port: int, reshard: bool, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=STAGES * dp)
    mesh = init_device_mesh("cpu", (STAGES, dp), mesh_dim_names=("pp", "dp"))
    s, replica = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    x, y = _data(replica)
    results = {}
    for mode in MODES:
        chunk = _chunks(STAGES)[s]
        for block in (chunk.a, chunk.b):
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard)
        fully_shard(chunk, mesh=mesh["dp"], reshard_after_forward=reshard)
        stage = PipelineStage(chunk, s, STAGES, torch.device("cpu"), group=mesh["pp"].get_group())
        groups = [list(chunk.a.parameters()), list(chunk.b.parameters())]
        if s == 1:  # stage 1's b.bias in no group: never frozen (stage 0 stays grouped whole)
            groups[1] = [chunk.b.weight]
        if mode == "whole0cut":  # stage 1 needs no input gradient where stage 0 is frozen whole
            enable_freezing(
                stage, groups, _frozen_fn(mode), lambda s, m: not (s == 1 and m % 2 == 0)
            )
        elif mode != "stock":
            enable_freezing(stage, groups, _frozen_fn(mode))
        sched = Schedule1F1B(stage, M, loss_fn=_loss)
        args = (x,) if s == 0 else ()
        kwargs = {"target": y, "losses": []} if s == STAGES - 1 else {}
        sched.step(*args, **kwargs)
        if mode == "all0":
            scale_group_grads(groups, {0: None})
        elif mode == "even0":
            scale_group_grads(groups, {0: M / (M - M // 2)})
        elif mode.startswith("whole0") and s == 0:
            scale_group_grads(groups, {0: M / (M - M // 2), 1: M / (M - M // 2)})
        grads = {
            n: None if p.grad is None else p.grad.full_tensor().clone()
            for n, p in chunk.named_parameters()
        }
        results[mode] = {s: grads}
        dist.barrier()
    if replica == 0:
        torch.save(results, f"{out}.{s}")
    dist.destroy_process_group()


def _reference(mbs: list[int], dp: int) -> list[dict[str, torch.Tensor]]:
    """Mean over the replicas and `mbs` of per-microbatch gradients, without pipeline or sharding."""
    chunks = _chunks(STAGES)
    for replica in range(dp):
        x, y = _data(replica)
        for m in mbs:
            h = x[m * MB_ROWS : (m + 1) * MB_ROWS]
            for c in chunks:
                h = c(h)
            (_loss(h, y[m * MB_ROWS : (m + 1) * MB_ROWS]) / (len(mbs) * dp)).backward()
    return [{n: p.grad.clone() for n, p in c.named_parameters()} for c in chunks]


@pytest.mark.slow
@pytest.mark.parametrize(("dp", "reshard"), [(1, False), (2, True)])
def test_freezing_under_fsdp2_is_exact(tmp_path: Path, dp: int, reshard: bool) -> None:
    out = str(tmp_path / "res")
    mp.start_processes(
        _worker,
        args=(dp, _free_port(), reshard, out),
        nprocs=STAGES * dp,
        start_method="spawn",
    )
    res: dict[str, dict[int, dict[str, torch.Tensor | None]]] = {}
    for s in range(STAGES):
        for mode, data in torch.load(f"{out}.{s}").items():
            res.setdefault(mode, {}).update(data)
    full, odd = _reference(list(range(M)), dp), _reference([1, 3], dp)
    for s in range(STAGES):
        for name, g in res["stock"][s].items():
            assert g is not None and torch.allclose(g, full[s][name], atol=1e-6), (s, name)
            assert torch.equal(res["zero"][s][name], g), (s, name)  # torch's own path, unchanged
            in_group0 = name.startswith("a.")
            if in_group0:  # frozen everywhere: no gradient at all, on every shard
                assert res["all0"][s][name] is None, (s, name)
            else:  # the others bit for bit
                assert torch.equal(res["all0"][s][name], g), (s, name)
            want = odd[s][name] if in_group0 else g
            assert torch.allclose(res["even0"][s][name], want, atol=1e-6), (s, name)
            want = odd[s][name] if s == 0 else g
            assert torch.allclose(res["whole0"][s][name], want, atol=1e-6), (s, name)
            assert torch.equal(res["whole0cut"][s][name], res["whole0"][s][name]), (s, name)
