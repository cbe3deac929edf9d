"""A training loop beside a re-plan: the solve in a thread of the rank against a child process.

`freezeopt train` solves an online re-plan while training continues. The heuristic's search is
pure Python: in a thread of the rank it holds the GIL that the rank's training loop needs between
torch calls. This measures the cost, side by side in one run: a training-like loop (one torch
thread; 20 forward/backward passes of a 64×64 matmul per iteration) runs alone, then while the same
re-plan (`freezeopt.training.replan.replan` of a synthetic 1F1B profile, heuristic, solved by the schedule's
options) runs in a thread, then while it runs in `freezeopt.training.replan_worker.ReplanWorker` (what
`freezeopt train` uses). Columns: loop iterations per second while the solve runs, the median,
mean, 99th percentile and longest iteration, and the solve's own seconds.

Usage: .venv/bin/python benchmarks/bench_overlap.py [--size 32x128] [--out benchmarks/overlap.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import synthetic_profile  # noqa: E402  (beside this script)

from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.torchpp.launch import load_avg  # noqa: E402


def loop_while(busy: Callable[[], bool], limit: int | None = None) -> dict[str, float]:
    """Run the training-like loop while `busy()` (or `limit` iterations); its iteration times."""
    import torch

    x = torch.randn(64, 64)
    w = torch.randn(64, 64, requires_grad=True)
    ts: list[float] = []
    t0 = time.perf_counter()
    while busy() and (limit is None or len(ts) < limit):
        t = time.perf_counter()
        for _ in range(20):
            (x @ w).relu().sum().backward()
        ts.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    ts.sort()
    n = len(ts)
    return {
        "n": n,
        "per_s": n / wall if wall > 0 else 0.0,
        "median_ms": ts[n // 2] * 1e3 if n else 0.0,
        "mean_ms": sum(ts) / n * 1e3 if n else 0.0,
        "p99_ms": ts[min(n - 1, int(n * 0.99))] * 1e3 if n else 0.0,
        "max_ms": ts[-1] * 1e3 if n else 0.0,
    }


def _load(v: tuple[float, float, float] | None) -> str:
    return ", ".join(f"{x:.2f}" for x in v) if v else "unknown"


def problem(size: str, tmp: Path) -> tuple[Any, Any, dict[str, float]]:
    """A re-plan request: spec, schedule, and measured costs with every 8th stage 5 % dearer."""
    from freezeopt.commands import solve_file
    from freezeopt.formats.profile import profile_sha256, save_profile
    from freezeopt.formats.schedule import Drift, Phases
    from freezeopt.model.dag import build_dag
    from freezeopt.solver import SolveOptions
    from freezeopt.training.replan import ReplanSpec

    stages, mb = (int(v) for v in size.split("x"))
    prof = synthetic_profile("1F1B", stages, mb, 4)
    path = tmp / "p.json"
    save_profile(prof, path)
    phases = Phases(warmup_steps=0, full_update_every=0, drift=Drift(step_time_error=1e6))
    opts = SolveOptions(mode="heuristic", solver="highs", budget=0.1, threads=1)
    _, sched = solve_file(path, opts, phases=phases, out=None)
    spec = ReplanSpec(profile=prof, profile_sha256=profile_sha256(prof), every=5)
    dag = build_dag(prof)
    measured = {str(a): c * (1.05 if a.stage % 8 == 0 else 1.0) for a, c in dag.cost.items()}
    return spec, sched, measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="32x128", help="stages x microbatches of the 1F1B profile")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "overlap.md")
    args = ap.parse_args()
    import torch

    from freezeopt.training.replan import replan
    from freezeopt.training.replan_worker import ReplanWorker

    torch.set_num_threads(1)
    before = load_avg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        spec, sched, measured = problem(args.size, Path(d))
    rows: list[tuple[str, dict[str, float], float]] = []
    rows.append(("alone", loop_while(lambda: True, limit=2000), 0.0))

    box: list[Any] = []
    th = threading.Thread(
        target=lambda: box.append(replan(spec, sched, measured, step=0, reason="every"))
    )
    th.start()
    stats = loop_while(th.is_alive)
    th.join()
    rows.append(("re-plan in a thread of this process", stats, box[0].solve_s))

    worker = ReplanWorker()
    worker.start()  # as `freezeopt train` starts it with the run: Python and imports come first
    if not worker.ready(timeout=120):
        raise SystemExit("the solver process did not start")
    worker.submit(spec, sched, measured, step=0, reason="every")
    stats = loop_while(lambda: not worker.done())
    out = worker.result()
    worker.close()
    assert not isinstance(out, str), out
    rows.append(("re-plan in the solver process (`freezeopt train`)", stats, out.solve_s))

    cmd = "python benchmarks/bench_overlap.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        "# A training loop beside an online re-plan",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "| | |",
        "|---|---|",
        f"| command | `{cmd.strip()}` |",
        f"| date | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} |",
        f"| machine | nproc {os.cpu_count()} |",
        f"| re-plan | 1F1B {args.size}, 4 groups per stage, heuristic, single-threaded HiGHS |",
        f"| load average (1, 5, 15 min) | before {_load(before)}; after {_load(load_avg())} |",
        f"| wall time | {time.perf_counter() - t_start:.0f} s |",
        "",
        "| loop | iterations/s | median ms | mean ms | p99 ms | longest ms | re-plan solve s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, st, solve_s in rows:
        solve = f"{solve_s:.1f}" if solve_s else "—"
        lines.append(
            f"| {name} | {st['per_s']:.0f} | {st['median_ms']:.2f} | {st['mean_ms']:.2f} | "
            f"{st['p99_ms']:.1f} | {st['max_ms']:.1f} | {solve} |"
        )
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
