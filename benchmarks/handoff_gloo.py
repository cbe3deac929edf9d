"""How long a 1F1B hand-off waits on shared cores: two gloo ranks, torch's batched send/receive.

Why: in the built-in job's profiled timeline some early hand-offs take 1.6–5.6 ms where the lag
measured elsewhere is about 0.4 ms (docs/profiling.md). This reproduces the pattern alone: both
ranks wait on a batched [send, receive] as torch's `Schedule1F1B` does in its steady state; rank
1 is busy for 10 ms first, so rank 0's batch is posted long before rank 1's; rank 0 then either
computes (as it would start its backward) or sleeps. Printed: how long rank 1's batch takes.

Run: torchrun --nproc-per-node 2 benchmarks/handoff_gloo.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

NUMEL = 2 * 128 * 128  # the built-in job's activation: microbatch 2 × seq 128 × d_model 128


def _busy(ms: float, a: torch.Tensor) -> None:
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e3 < ms:
        a @ a


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    a = torch.randn(256, 256)
    for sender in ("computes", "sleeps"):
        waits = []
        for _ in range(args.rounds):
            dist.barrier()
            if rank == 0:
                x, gy = torch.randn(NUMEL), torch.empty(NUMEL)
                ops = [dist.P2POp(dist.isend, x, 1), dist.P2POp(dist.irecv, gy, 1)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                if sender == "computes":  # as rank 0 would start its backward
                    _busy(14.0, a)
                else:  # the control: rank 0 idle, so the cores are free
                    time.sleep(0.014)
            else:
                _busy(10.0, a)
                gy, x = torch.randn(NUMEL), torch.empty(NUMEL)
                t0 = time.perf_counter()
                ops = [dist.P2POp(dist.isend, gy, 0), dist.P2POp(dist.irecv, x, 0)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                waits.append((time.perf_counter() - t0) * 1e3)
        if rank == 1:
            waits.sort()
            print(
                f"rank 0 {sender:8s} after its batch: rank 1's batch takes median "
                f"{statistics.median(waits):.2f} ms, p90 {waits[int(0.9 * len(waits))]:.2f} ms, "
                f"max {waits[-1]:.2f} ms ({len(waits)} rounds)",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
