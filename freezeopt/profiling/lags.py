"""The point-to-point lag between pipeline ranks, measured by ping-pong.

Why: the profile takes each cross-rank edge's lag from the wall timeline of the measured steps
(`freezeopt.profiling.assemble`); an edge with too few samples there falls back to this — round
trips of the activation's own size and dtype between the two ranks, one pair at a time, every
other rank waiting at a barrier. Every rank of the process group must call it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["WARMUP_TRIPS", "measure_lags"]

WARMUP_TRIPS = 5
"""Round trips run before the ones kept."""

Shapes = dict[int, tuple[tuple[int, ...], str]]


def measure_lags(
    rank: int,
    stage_rank: Sequence[int],
    act_shapes: Shapes,
    *,
    device: Any,
    clock: Any,
    samples: int,
    beat: Any,
) -> tuple[dict[tuple[int, int], tuple[float, ...]], Shapes]:
    """(src rank, dst rank) → one-way ms samples (half a round trip, measured on the sending
    side), and every stage's output (shape, dtype) gathered from all ranks. `act_shapes` holds
    this rank's stages' outputs; `clock` is a `freezeopt.torchpp.pipeline.Clock`."""
    import torch
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, act_shapes)
    shapes: Shapes = {}
    for d in gathered:
        shapes.update(d)
    sr = stage_rank
    pairs = sorted(
        {
            (sr[s], sr[s + 1], shapes[s])
            for s in range(len(sr) - 1)
            if sr[s] != sr[s + 1] and s in shapes
        }
    )
    out: dict[tuple[int, int], tuple[float, ...]] = {}
    for ra, rb, (shape, dtype) in pairs:
        dist.barrier()
        if rank not in (ra, rb):
            continue
        buf = torch.zeros(shape, dtype=getattr(torch, dtype.replace("torch.", "")), device=device)
        kept = []
        for i in range(WARMUP_TRIPS + samples):
            if rank == ra:
                t0 = time.perf_counter()
                dist.send(buf, rb)
                dist.recv(buf, rb)
                clock.sync()
                if i >= WARMUP_TRIPS:
                    kept.append((time.perf_counter() - t0) * 1e3 / 2)
            else:
                dist.recv(buf, ra)
                dist.send(buf, ra)
        beat.tick()
        if rank == ra:
            out[(ra, rb)] = tuple(kept)
    dist.barrier()
    return out, shapes
