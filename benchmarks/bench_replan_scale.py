"""Re-plan solve time at scale: a run's re-plans re-solving one warm LP, against cold solves.

No training here: the solve of an online re-plan (`freezeopt.training.replan.replan`, what rank 0 runs in
the background during `freezeopt train`) on synthetic profiles, fed "measured" costs that drift
the way a run's do. Re-plan r sees the profile's action costs with the stages s where
`s % 8 == r % 8` 5 % dearer, so from one re-plan to the next 2 × S/8 stages change by 5 %. Each
re-plan is solved twice, side by side in one process: `warm`, with the run's `LpCache` (the LP
re-solved from the last re-plan's basis, as `freezeopt train` does), and `cold`, from a fresh
model. The run's first re-plan is cold in both (nothing to start from). Single-threaded HiGHS.

Columns: re-plan seconds (the whole `replan` call: DAG, LP, heuristic, schedule file), the LP's
part of it and its simplex pivots (phase 1 + phase 2; phase 1 by interior point counts 0), whether
the LP was re-solved warm (from 10 000 actions a warm phase 1 that runs out of its pivot budget is
solved cold by interior point, and so are the run's later re-solves), the new plan's predicted
step time, and the LP bound of both (they must agree: the warm re-solve is exact).

A third arm, `short`, re-plans the same costs with a short time limit (`--short-limit`, 2 s;
what `freezeopt train --replan-time-limit 2` does): from 32×128 the LP does not fit in it, and
the re-plan answers without it (the first-order relaxation and the search, `freezeopt.solver.relax`).
Its plan's gap is against the warm arm's LP bound (exact for the same costs).

Usage: .venv/bin/python benchmarks/bench_replan_scale.py [--cases 1F1B:32x128,...] [--replans 4]
       [--short-limit 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import synthetic_profile  # noqa: E402  (beside this script)

from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.solver.lp_arrays import LpAnswer, LpCache  # noqa: E402
from freezeopt.torchpp.launch import load_avg  # noqa: E402

DEFAULT_CASES = "1F1B:8x64,1F1B:32x128,Interleaved1F1B:32x128,ZBVZeroBubble:32x128"


class TimedCache(LpCache):
    """An `LpCache` that records each LP solve: seconds, pivots, warm or not, phase-1 optimum."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[dict[str, Any]] = []

    def solve(self, dag: Any, **kw: Any) -> tuple[LpAnswer, float]:
        t0 = time.perf_counter()
        ans, build_s = super().solve(dag, **kw)
        self.log.append(
            {
                "s": time.perf_counter() - t0,
                "pivots": ans.iterations,
                "warm": ans.warm,
                "t1": ans.t1,
                "method": ans.method,
            }
        )
        return ans, build_s


def _warm_cell(log: dict[str, Any]) -> str:
    if not log["warm"]:
        return "no"
    return "yes" if log["method"] == "simplex" else "gave up: cold ipm"


def _s(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def _case(text: str) -> tuple[str, int, int]:
    name, size = text.split(":")
    st, mb = size.lower().split("x")
    return name, int(st), int(mb)


def run_case(
    name: str, stages: int, mb: int, replans: int, groups: int, work: Path, short: float
) -> list[dict]:
    import dataclasses

    from freezeopt.commands import solve_file
    from freezeopt.formats.profile import profile_sha256, save_profile
    from freezeopt.formats.schedule import Drift, Phases
    from freezeopt.model.dag import build_dag
    from freezeopt.solver import SolveOptions
    from freezeopt.training.replan import ReplanSpec, replan

    prof = synthetic_profile(name, stages, mb, groups)
    path = work / f"{name}-{stages}x{mb}.json"
    save_profile(prof, path)
    phases = Phases(warmup_steps=0, full_update_every=0, drift=Drift(step_time_error=1e6))
    opts = SolveOptions(mode="heuristic", solver="highs", budget=0.1, time_limit=600)
    _, sched = solve_file(path, opts, phases=phases, out=None)
    spec = ReplanSpec(profile=prof, profile_sha256=profile_sha256(prof), every=1, time_limit=600)
    dag = build_dag(prof)
    run_cache = TimedCache()
    rows = []
    for r in range(replans):
        dear = [s for s in range(stages) if s % 8 == r % 8]
        measured = {str(a): c * (1.05 if a.stage in dear else 1.0) for a, c in dag.cost.items()}
        got = {}
        for arm in ("warm", "cold"):
            cache = run_cache if arm == "warm" else TimedCache()
            out = replan(spec, sched, measured, step=r, reason="every", lp_cache=cache)
            got[arm] = (out, cache.log[-1])
        if short > 0:
            quick = dataclasses.replace(spec, time_limit=short)
            got["short"] = replan(
                quick, sched, measured, step=r, reason="every", lp_cache=LpCache()
            )
        rows.append({"replan": r, "dear": dear, **got})
        out_w = got["warm"][0]
        print(
            f"  {name} {stages}x{mb} re-plan {r}: warm {out_w.solve_s:.2f} s "
            f"({'warm' if got['warm'][1]['warm'] else 'cold'} LP {got['warm'][1]['s']:.2f} s), "
            f"cold {got['cold'][0].solve_s:.2f} s (LP {got['cold'][1]['s']:.2f} s)"
            + (f", short {got['short'].solve_s:.2f} s" if "short" in got else ""),
            file=sys.stderr,
            flush=True,
        )
        if out_w.adopted:
            sched = out_w.schedule
    return rows


def _gap(plan_ms: float, bound_ms: float) -> float:
    return (plan_ms - bound_ms) / plan_ms * 100


def render(results: dict[str, list[dict]], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    short = args.short_limit > 0
    L = [
        "# Re-plan solve time at scale: warm LP against cold",
        "",
        "Written by `benchmarks/bench_replan_scale.py`; every number below comes from its runs.",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"- {meta['date']}, commit {meta['commit']}, {os.cpu_count()} cores; load average before "
        f"{meta['load_before']}, after {meta['load_after']}; {meta['wall']:.0f} s in all",
        "- synthetic profiles (seed 0, "
        f"{args.groups} groups per stage, 2 gradient-trace steps); the schedule re-planned is "
        "`solve --mode heuristic --solver highs --budget 0.1` of the profile; re-plans in "
        "`heuristic` mode",
        "- re-plan r: the profile's action costs, stages with s % 8 == r % 8 made 5 % dearer; "
        "`warm` keeps one `LpCache` over the run's re-plans, `cold` solves each from a fresh model",
        "",
        "| case | re-plan | stages 5 % dearer | re-plan s warm / cold | LP s warm / cold "
        "| LP pivots warm / cold | LP warm? | predicted ms warm / cold | LP bound ms warm / cold |"
        + (
            f" {args.short_limit:g} s limit: re-plan s, predicted ms (gap), status |"
            if short
            else ""
        ),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if short else ""),
    ]
    speed: list[str] = []
    quick: list[str] = []
    for case, rows in results.items():
        ws, cs, gw, gq, sq = [], [], [], [], []
        for row in rows:
            (ow, lw), (oc, lc) = row["warm"], row["cold"]
            dear = ", ".join(map(str, row["dear"]))
            cell = ""
            if short:
                oq = row["short"]
                gap = _gap(oq.new_predicted_ms, lw["t1"])
                cell = f" {_s(oq.solve_s)}, {oq.new_predicted_ms:.1f} ({gap:.2f} %), {oq.status} |"
                gq.append(gap)
                gw.append(_gap(ow.new_predicted_ms, lw["t1"]))
                sq.append(oq.solve_s)
            L.append(
                f"| {case} | {row['replan']} | {dear} | {_s(ow.solve_s)} / {_s(oc.solve_s)} "
                f"| {_s(lw['s'])} / {_s(lc['s'])} "
                f"| {lw['pivots'][0]}+{lw['pivots'][1]} / {lc['pivots'][0]}+{lc['pivots'][1]} "
                f"| {_warm_cell(lw)} "
                f"| {ow.new_predicted_ms:.1f} / {oc.new_predicted_ms:.1f} "
                f"| {lw['t1']:.4f} / {lc['t1']:.4f} |" + cell
            )
            if row["replan"] > 0:
                ws.append(lw["s"])
                cs.append(lc["s"])
        if ws:
            speed.append(
                f"- {case}: the warm arm's LP took {_s(min(ws))}–{_s(max(ws))} s against "
                f"{_s(min(cs))}–{_s(max(cs))} s cold (in all, cold ÷ warm = {sum(cs) / sum(ws):.1f})"
            )
        if sq:
            quick.append(
                f"- {case}: re-plans of {_s(min(sq))}–{_s(max(sq))} s, plans "
                f"{min(gq):.2f}–{max(gq):.2f} % from the LP bound (warm arm: "
                f"{min(gw):.2f}–{max(gw):.2f} %, in {_s(min(r['warm'][0].solve_s for r in rows))}"
                f"–{_s(max(r['warm'][0].solve_s for r in rows))} s)"
            )
    L += ["", "Warm against cold, re-plans after the first (LP time):", "", *speed, ""]
    if quick:
        L += [f"With a {args.short_limit:g} s limit (every re-plan):", "", *quick, ""]
    L += [
        "Caveats: single measurements on a shared 2-core machine (see the load average); the "
        "warm and cold solves of one re-plan run one after the other in one process. Predicted "
        "step times may differ a little: the warm and cold LPs reach the same optimum at "
        "different vertices, and the heuristic rounds the vertex it gets.",
        "",
    ]
    return "\n".join(L)


def _commit() -> str:
    import subprocess

    r = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return r.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="SCHEDULE:STAGESxMICROBATCHES, ...")
    ap.add_argument("--replans", type=int, default=4, help="Re-plans per run (the first is cold).")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument(
        "--short-limit", type=float, default=2.0, help="Time limit of the short arm (0: none)."
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "replan_scale.md")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    command = "python " + shlex.join(["benchmarks/bench_replan_scale.py", *sys.argv[1:]])
    before = load_avg()
    t0 = time.perf_counter()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as d:
        for text in args.cases.split(","):
            name, st, mb = _case(text.strip())
            print(f"{name} {st}x{mb}", file=sys.stderr, flush=True)
            results[f"{name} {st}×{mb}"] = run_case(
                name, st, mb, args.replans, args.groups, Path(d), args.short_limit
            )
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "load_before": " / ".join(f"{x:.2f}" for x in before) if before else "unknown",
        "load_after": " / ".join(f"{x:.2f}" for x in load_avg() or ()) or "unknown",
        "wall": time.perf_counter() - t0,
    }
    atomic_write_text(args.out, render(results, args, meta))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
