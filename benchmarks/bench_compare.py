"""The policy comparison benchmark: `freezeopt compare` on the built-in job (1F1B and ZBV) and the
unbalanced example, written to benchmarks/RESULTS.md with each report beside it.

Run by `make bench` after the solver benchmark. Every number in RESULTS.md comes from the runs this
script starts; nothing is copied in by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from freezeopt.compare import CompareOptions, compare_job, format_compare, load_compare  # noqa: E402
from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.job import load_job, replace_job  # noqa: E402

CASES = (
    ("tiny-gpt-1f1b", "tiny-gpt", {}),
    ("tiny-gpt-zbv", "tiny-gpt", {"schedule": "ZBVZeroBubble", "stages_per_rank": 2}),
    ("tiny-gpt-unbalanced", str(ROOT / "examples" / "tiny-gpt-unbalanced.yaml"), {}),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--sweep", default="0.05,0.2")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES))
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild RESULTS.md from the compare folders already there",
    )
    ap.add_argument(
        "--sweep-cases", default="tiny-gpt-1f1b", help="cases that also run the budget sweep"
    )
    args = ap.parse_args()
    wanted = set(args.cases.split(","))
    sweep = tuple(float(b) for b in args.sweep.split(",") if b)
    opts = CompareOptions(
        policies=(
            "none",
            "uniform",
            "timelyfreeze",
            "stability",
            "freezeopt",
            "freezeopt-heuristic",
        ),
        steps=args.steps,
        warmup_steps=10,
        budget=args.budget,
        repeats=args.repeats,
        val_every=25,
        sweep=sweep,
    )
    t0 = time.perf_counter()
    sections = []
    for name, job_ref, overrides in CASES:
        if name not in wanted:
            continue
        job = replace_job(load_job(job_ref), **overrides) if overrides else load_job(job_ref)
        print(f"[bench] compare {name} …", file=sys.stderr, flush=True)
        case_opts = (
            opts if name in args.sweep_cases.split(",") else dataclasses.replace(opts, sweep=())
        )
        out_dir = ROOT / "benchmarks" / f"compare-{name}"
        if args.report_only:
            if not (out_dir / "results.json").exists():
                sections += [f"## {name}", "", "Not run in this benchmark run.", ""]
                continue
            rep = load_compare(out_dir)
        else:
            rep = compare_job(job, out_dir=out_dir, opts=case_opts, progress=False)
        sections += [
            f"## {name}",
            "",
            f"Report: [compare-{name}/report.md](compare-{name}/report.md)",
            "",
            format_compare(rep),
            "",
        ]
        sections += [f"![loss against time](compare-{name}/loss_vs_time.png)", ""]
        if rep.sweep:
            sections += [f"![budget sweep](compare-{name}/budget_sweep.png)", ""]
    load = os.getloadavg()
    how = (
        "Rebuilt with `--report-only` from the compare folders already there (each folder's report.md and "
        "run folders hold the runs' own records); "
        if args.report_only
        else ""
    )
    head = [
        "# Freezing policies compared on real pipelined training",
        "",
        how,
        f"`python benchmarks/bench_compare.py --steps {args.steps} --repeats {args.repeats} --budget {args.budget} "
        f"--sweep {args.sweep} --sweep-cases {args.sweep_cases}` — {(time.perf_counter() - t0) / 60:.1f} min on {os.cpu_count()} cores "
        f"(load average at the end {load[0]:.2f}). Each policy: the same job, seed and data, {args.steps} steps "
        f"of which the first 10 are full-update warm-up; step time = median after warm-up (gloo, 2 ranks, 1 "
        "thread each, CPU). Predicted times come from the profile's DAG (its own clock); the gain captured "
        "scales the LP bound by the run's measured no-freezing step time. `time to none's val loss` is training "
        "seconds (sum of step times) until the validation loss first reaches the `none` run's final one, "
        "measured every 25 steps. Drift fallbacks are off in comparisons (each policy is replayed as planned).",
        "",
    ]
    atomic_write_text(args.out, "\n".join(head + sections) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
