"""What freezing costs, profiled at points along a run: does a profile taken where a plan runs
predict what the plan loses there? Written to benchmarks/cost_over_training.md (and .json).

The time-to-quality benchmark's long from-scratch regime (benchmarks/TTQ.md) found the default
plan losing far more progress after the first quarter of 600 steps than the profile, taken at step
0, predicted. This script trains the same job without freezing for N steps (a checkpoint every K),
profiles the job at step 0 and from each checkpoint (`init:`: the weights; the optimizer starts
afresh, as in every profile), and reads, from each profile:

* the gradient noise scale B = tr(Σ)/|G|² of every group (`gns` sensitivity), in sequences, beside
  the step's batch;
* what the regime's `freezeopt-ttq` plan (benchmarks/ttq-from-scratch-long/schedules) would lose
  of each step's progress by the profile's two models: `measured` (the probe loss's allocation to
  the groups, linear in the microbatches frozen) and `gns` (the noise-scale curve);
* what `freezeopt-ttq` would plan from that profile: the share of (group, microbatch) slots frozen
  and its predicted time to quality (below 1: it pays).

These are set beside the progress that plan kept per step in each quarter of the regime's runs
(TTQ.json). Usage: python benchmarks/bench_cost_over_training.py [--steps 600 --every 150]
[--report-only].
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_ttq import frozen_share  # noqa: E402
from freezeopt.compare.policies import policy_schedule  # noqa: E402
from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.formats.profile import Profile, load_profile  # noqa: E402
from freezeopt.formats.schedule import load_schedule  # noqa: E402
from freezeopt.model.dag import build_dag, schedule_plan  # noqa: E402
from freezeopt.model.sensitivity import estimate_signal  # noqa: E402
from freezeopt.profiling.run import profile_job  # noqa: E402
from freezeopt.solver import FreezeProblem, SolveOptions  # noqa: E402
from freezeopt.torchpp.job import load_job, replace_job  # noqa: E402
from freezeopt.torchpp.launch import load_avg  # noqa: E402
from freezeopt.training.options import CheckpointOptions, TrainOptions  # noqa: E402
from freezeopt.training.train import train_job  # noqa: E402

REGIME = ROOT / "benchmarks" / "ttq-from-scratch-long"
PLAN = REGIME / "schedules" / "freezeopt-ttq-b0.1.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=150)
    ap.add_argument("--folder", type=Path, default=ROOT / "benchmarks" / "cost-over-training")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "cost_over_training.md")
    ap.add_argument("--report-only", action="store_true", help="rebuild from the folder")
    args = ap.parse_args()
    folder: Path = args.folder
    points = list(range(0, args.steps + 1, args.every))
    if not args.report_only:
        folder.mkdir(parents=True, exist_ok=True)
        job = load_job("tiny-gpt")
        t0, load0 = time.monotonic(), load_avg()
        train_job(
            job,
            TrainOptions(
                steps=args.steps,
                out_dir=folder / "run",
                checkpoints=CheckpointOptions(every=args.every, keep=len(points)),
                progress=False,
                overwrite=True,
            ),
        )
        for step in points:
            ck = None if step == 0 else folder / "run" / "checkpoints" / f"step-{step:08d}"
            spec = job if ck is None else replace_job(job, init=str(ck))
            profile_job(spec, out=folder / f"profile-{step}.json", progress=False)
        (folder / "host.json").write_text(
            json.dumps(
                {
                    "command": shlex.join(["python", *sys.argv]),
                    "minutes": round((time.monotonic() - t0) / 60, 1),
                    "load_avg_before": load0,
                    "load_avg_after": load_avg(),
                },
                indent=1,
            )
            + "\n"
        )
    rows = [point(load_profile(folder / f"profile-{s}.json"), s) for s in points]
    kept = json.loads((ROOT / "benchmarks" / "TTQ.json").read_text())["regimes"][
        "from-scratch-long"
    ]["policies"]["freezeopt-ttq"]
    host = json.loads((folder / "host.json").read_text())
    data = {"host": host, "points": rows, "ttq_kept_by_quarter": kept["progress_kept_by_quarter"]}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(data, indent=1) + "\n")
    atomic_write_text(args.out, markdown(data, args.steps))
    print(args.out.read_text())
    return 0


def point(p: Profile, step: int) -> dict[str, Any]:
    """One profile's figures (module docstring)."""
    dag = build_dag(p)
    plan = schedule_plan(load_schedule(PLAN), dag)
    signal = {est: estimate_signal(p, est) for est in ("measured", "gns")}
    lost = {
        est: round(FreezeProblem(dag, sig, SolveOptions(sensitivity=est)).signal_of(plan), 4)
        for est, sig in signal.items()
    }
    gns = [g for st in signal["gns"] for g in st]
    noise = {f"{g.stage}/{g.group}": round(g.noise_scale or 0.0, 2) for g in gns}
    sched, res = policy_schedule(p, "freezeopt-ttq", budget=0.1, sensitivity="measured")
    return {
        "step": step,
        "batch": p.pipeline.microbatch_size * p.pipeline.n_microbatches,
        "probe_loss": None if p.probe is None else round(p.probe.loss[0], 4),
        "noise_scale": noise,
        "noise_scale_median": round(statistics.median(noise.values()), 2),
        "plan_lost_measured": lost["measured"],
        "plan_lost_gns": lost["gns"],
        "resolved_frozen_share": round(frozen_share(schedule_plan(sched, dag), dag), 4),
        "resolved_ttq": None if res.time_to_quality is None else round(res.time_to_quality, 4),
    }


def markdown(data: dict[str, Any], steps: int) -> str:
    host = data["host"]
    kept = data["ttq_kept_by_quarter"]
    q = steps // 4
    lines = [
        "# What freezing costs, profiled along a run",
        "",
        f"`{host['command']}`, {host['minutes']} min on this project's 2-core machine (load "
        f"{host['load_avg_before'][0]:.1f} before, {host['load_avg_after'][0]:.1f} after). "
        "The built-in job (tiny-gpt, 1F1B, 2 ranks, 8 microbatches of 2 sequences) trained "
        f"without freezing for {steps} steps and profiled at step 0 and from each checkpoint "
        "(weights only; the optimizer starts afresh). Plan: `freezeopt-ttq`'s from the long "
        "from-scratch regime (benchmarks/TTQ.md), made from a step-0 profile.",
        "",
        "| profiled at step | probe loss | B, median over groups (sequences; batch "
        f"{data['points'][0]['batch']}) | plan's progress lost, measured model | … gns model | "
        "re-solved here: slots frozen | … predicted ttq | that plan's progress kept per step, "
        "measured (TTQ.md quarter) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(data["points"]):
        quarter = ""
        if i < len(kept) and kept[i] is not None:
            quarter = f"{kept[i]:.3f} (steps {i * q}–{(i + 1) * q})"
        lines.append(
            f"| {r['step']} | {r['probe_loss']} | {r['noise_scale_median']:g} | "
            f"{100 * r['plan_lost_measured']:.1f} % | {100 * r['plan_lost_gns']:.1f} % | "
            f"{100 * r['resolved_frozen_share']:.1f} % | "
            f"{'—' if r['resolved_ttq'] is None else format(r['resolved_ttq'], '.3f')} | "
            f"{quarter} |"
        )
    lines += ["", "Noise scale per group (sequences):", ""]
    names = list(data["points"][0]["noise_scale"])
    lines.append("| step | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for r in data["points"]:
        lines.append(
            f"| {r['step']} | " + " | ".join(f"{r['noise_scale'][n]:g}" for n in names) + " |"
        )
    lines += [
        "",
        "What it says, and what it does not (no model tracks the quarters): docs/solver.md, "
        '"The model", on `--sensitivity measured`.',
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
