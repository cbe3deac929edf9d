"""The policy comparison benchmark: `freezeopt compare` on the built-in job (1F1B and ZBV) and the
unbalanced example, written to benchmarks/RESULTS.md with each report beside it.

Run by `make bench` after the solver benchmark. Every number in RESULTS.md comes from the runs this
script starts; nothing is copied in by hand. Each case's compare folder (`compare-<case>/` beside
`--out`) keeps its `results.json`, which records how it was run (this script's command line, start,
duration, load average); `--report-only` rebuilds RESULTS.md from those folders and quotes that
record, not the rebuild's.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from freezeopt.compare.policies import Policy  # noqa: E402
from freezeopt.compare.run import (  # noqa: E402
    CompareOptions,
    CompareReport,
    compare_job,
    format_compare,
    format_run_info,
    load_compare,
)
from freezeopt.errors import FreezeoptError  # noqa: E402
from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.torchpp.job import load_job, replace_job  # noqa: E402

CASES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("tiny-gpt-1f1b", "tiny-gpt", {}),
    ("tiny-gpt-zbv", "tiny-gpt", {"schedule": "ZBVZeroBubble", "stages_per_rank": 2}),
    ("tiny-gpt-unbalanced", str(ROOT / "examples" / "tiny-gpt-unbalanced.yaml"), {}),
)
POLICIES: tuple[Policy, ...] = (
    "none",
    "uniform",
    "timelyfreeze",
    "timelyfreeze-matched",
    "stability",
    "freezeopt",
    "freezeopt-heuristic",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--overrun", type=float, default=1.5)
    ap.add_argument("--val-every", type=int, default=10)
    ap.add_argument("--sweep", default="0.05,0.2")
    names = [c[0] for c in CASES]
    ap.add_argument("--cases", default=",".join(names), help=f"any of {', '.join(names)}")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild --out from the compare folders beside it, as they were run",
    )
    ap.add_argument(
        "--sweep-cases", default="tiny-gpt-1f1b", help="cases that also run the budget sweep"
    )
    ap.add_argument(
        "--policies", default=",".join(POLICIES), help="policies to run (none is always first)"
    )
    args = ap.parse_args()
    policies = tuple(p for p in args.policies.split(",") if p)
    if "none" not in policies or any(p not in POLICIES for p in policies):
        bad = next((p for p in policies if p not in POLICIES), "none missing")
        print(
            f"error: --policies: {bad!r}; use none plus any of {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    wanted = [c for c in args.cases.split(",") if c]
    unknown = [c for c in wanted if c not in names]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; use {', '.join(names)}", file=sys.stderr)
        return 2
    try:
        sweep = tuple(float(b) for b in args.sweep.split(",") if b)
    except ValueError:
        print(f"error: --sweep {args.sweep!r}: write budgets like 0.05,0.2", file=sys.stderr)
        return 2
    opts = CompareOptions(
        policies=tuple(p for p in POLICIES if p in policies),
        steps=args.steps,
        warmup_steps=10,
        budget=args.budget,
        repeats=args.repeats,
        val_every=args.val_every,
        overrun=args.overrun,
        sweep=sweep,
    )
    command = shlex.join(["python", "benchmarks/bench_compare.py", *sys.argv[1:]])
    root = args.out.resolve().parent
    reports: list[tuple[str, CompareReport | None]] = []
    try:
        for name, job_ref, overrides in CASES:
            if name not in wanted:
                continue
            out_dir = root / f"compare-{name}"
            if args.report_only:
                found = (out_dir / "results.json").exists()
                reports.append((name, load_compare(out_dir) if found else None))
                continue
            job = replace_job(load_job(job_ref), **overrides) if overrides else load_job(job_ref)
            print(f"[bench] compare {name} …", file=sys.stderr, flush=True)
            case_opts = (
                opts if name in args.sweep_cases.split(",") else dataclasses.replace(opts, sweep=())
            )
            rep = compare_job(job, out_dir=out_dir, opts=case_opts, progress=False, command=command)
            reports.append((name, rep))
    except FreezeoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = results_md(reports, rebuilt=args.report_only)
    atomic_write_text(args.out, text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def results_md(reports: list[tuple[str, CompareReport | None]], *, rebuilt: bool) -> str:
    """RESULTS.md from the cases' reports; the header describes the runs as their records say."""
    done = [(n, r) for n, r in reports if r is not None]
    infos = [r.run_info for _, r in done if r.run_info]
    head = ["# Freezing policies compared on real pipelined training", ""]
    if rebuilt:
        head += [
            "Rebuilt with `--report-only` from the compare folders (each folder's `results.json` "
            "records how its runs were made; `report.md` and the run folders hold them).",
            "",
        ]
    commands = list(dict.fromkeys(i.get("command") for i in infos if i.get("command")))
    if infos:
        total = sum(float(i.get("wall_s") or 0.0) for i in infos)
        first, last = infos[0], infos[-1]
        load0, load1 = first.get("load_avg_start"), last.get("load_avg_end")
        how = f"`{commands[0]}`" if len(commands) == 1 else "The cases below (commands in each)"
        line = (
            f"{how}: started {min(str(i.get('started')) for i in infos)}, "
            f"{total / 60:.1f} min of comparisons on {first.get('cpu_count')} cores"
        )
        if load0 and load1:
            line += f" (load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end)"
        head += [line + ".", ""]
    if done:
        head += [_method(done[0][1].options), ""]
    sections: list[str] = []
    for name, rep in reports:
        sections += [f"## {name}", ""]
        if rep is None:
            sections += ["Not run in this benchmark run.", ""]
            continue
        if len(commands) > 1 and rep.run_info:
            sections += [format_run_info(rep.run_info), ""]
        sections += [
            f"Report: [compare-{name}/report.md](compare-{name}/report.md)",
            "",
            format_compare(rep),
            "",
        ]
        if rep.warnings:
            sections += [f"Warnings from the runs: {len(rep.warnings)} (listed in the report).", ""]
        for fig in rep.figures or ("loss_vs_time.png",):
            sections += [f"![{fig[: -len('.png')]}](compare-{name}/{fig})", ""]
    return "\n".join(head + sections).rstrip("\n") + "\n"


def _method(o: dict[str, Any]) -> str:
    n = o.get("steps")
    return (
        f"Each case: every policy on the same job, seed and data; {o.get('repeats')} repeat(s), each "
        f"training `none` first for {n} steps (its validation loss at step {n} is the repeat's "
        f"target), then the other policies in an order rotated per repeat. Freezing policies may run "
        f"up to {o.get('overrun')}×{n} steps and stop at the first validation from step {n} on once "
        f"they reach the target (validation every {o.get('val_every')} steps and at step {n}). The "
        f"first {o.get('warmup_steps')} steps are full-update warm-up; step time = median of steps "
        f"{o.get('warmup_steps')}..{n}−1 (gloo, 2 ranks, 1 thread each, CPU), its ratio to `none` "
        "taken per repeat (median, min–max). Train and validation loss are at step "
        f"{n}, like for like. `time to none's val loss` is training seconds (sum of step times) "
        "until the first validation at or below the target; `× none's time` divides it by `none`'s "
        "own time to that loss. Predicted times come from the profile's DAG (its own clock); the "
        "gain captured scales the LP bound by the run's measured no-freezing step time. "
        "`timelyfreeze-matched` is TimelyFreeze with its per-stage cap chosen so it drops the "
        "same share of signal as the budget. Drift fallbacks are off in comparisons (each policy "
        "is replayed as planned)."
    )


if __name__ == "__main__":
    sys.exit(main())
