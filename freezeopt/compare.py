"""`freezeopt compare`: every freezing policy on the same real job, side by side, with a report.

One profile, then for each policy (`freezeopt.policies`) a schedule file and real training runs
with the same runtime, job, seed and data order; policies alternate across repeats (each repeat
rotates the order) so slow drift of the machine falls on all of them alike. Measured per run:
the median step time after warm-up, the train loss, and the held-out validation loss over the
run. The report (`report.md`, `results.json`, PNG plots) gives per policy the measured step time
and its ratio to `none`, the predicted step time, the share of the LP-bound gain captured
((none − measured) / (none − LP bound), with the prediction scaled to the run's own no-freezing
speed), final train and validation loss, and the wall-clock time to reach the `none` run's final
validation loss; plus loss-versus-time curves and a budget sweep (step time against validation
loss, one curve per policy).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from freezeopt.errors import InputError
from freezeopt.fileio import atomic_write_bytes, atomic_write_text
from freezeopt.job import Job
from freezeopt.policies import POLICIES, Policy, policy_schedule
from freezeopt.profile_file import load_profile
from freezeopt.schedule import Drift, Phases, save_schedule

__all__ = [
    "CompareOptions",
    "CompareReport",
    "PolicyResult",
    "compare_job",
    "format_compare",
    "load_compare",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareOptions:
    """What to compare and how long."""

    policies: tuple[Policy, ...] = ("none", "uniform", "timelyfreeze", "stability", "freezeopt")
    steps: int = 120
    """Optimizer steps per run."""
    warmup_steps: int = 10
    """Full-update steps at the start of every run (not counted in step times)."""
    budget: float = 0.1
    repeats: int = 1
    val_every: int = 20
    sweep: tuple[float, ...] = ()
    """Budgets for the sweep (each: one run per policy that has a budget)."""
    seed: int = 0
    time_limit: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One training run, as measured."""

    policy: str
    budget: float
    repeat: int
    step_ms: float
    """Median step time after warm-up."""
    loss: float
    """Mean train loss over the last 10 steps."""
    val_loss: float
    curve: tuple[tuple[float, float], ...]
    """(seconds of training, validation loss) at each validation point."""
    loss_curve: tuple[tuple[float, float], ...]
    """(seconds of training, train loss) per step."""
    out_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyResult:
    """A policy's figures (medians over repeats)."""

    policy: str
    step_ms: float
    ratio: float
    """step_ms / the `none` policy's step_ms."""
    predicted_ms: float
    predicted_ratio: float
    lp_bound_ms: float
    gain_captured: float | None
    """(none − measured) / (none − LP bound), prediction scaled to this machine's no-freeze speed."""
    signal_dropped: float
    loss: float
    val_loss: float
    time_to_target_s: float | None
    """Training seconds to reach the `none` run's final validation loss (None: never)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareReport:
    job: str
    out_dir: str
    options: dict[str, Any]
    results: tuple[PolicyResult, ...]
    runs: tuple[Run, ...]
    sweep: tuple[Run, ...] = field(default=())
    warnings: tuple[str, ...] = ()


def compare_job(
    job: str | Path, *, out_dir: Path, opts: CompareOptions, progress: bool = True
) -> CompareReport:
    """Profile `job` once, then train it under each policy; write the report into `out_dir`."""
    from freezeopt.profile import profile_job
    from freezeopt.train import train_job

    bad = [p for p in opts.policies if p not in POLICIES]
    if bad:
        raise InputError(f"unknown policy {bad[0]!r}; use {', '.join(POLICIES)}")
    if "none" not in opts.policies:
        raise InputError(
            "the comparison needs the `none` policy as its reference; add it to --policies"
        )
    if opts.steps <= opts.warmup_steps + 5:
        raise InputError(f"--steps must exceed the warm-up ({opts.warmup_steps}) by more than 5")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof_path = out_dir / "profile.json"
    profile_job(job, out=prof_path, progress=progress)
    profile = load_profile(prof_path)
    # Each policy is replayed as planned: the drift rules that fall back to full updates are set out
    # of reach (non-finite values still stop an update), since a fallback window would mix the
    # policies and the step-time rule fires on a busy machine's noise. `fallbacks` is still reported.
    off = Drift(loss_rise=1e6, grad_norm_spike=1e6, step_time_error=1e6)
    phases = Phases(warmup_steps=opts.warmup_steps, full_update_every=0, drift=off)

    predicted: dict[tuple[str, float], Any] = {}

    def schedule_for(policy: Policy, budget: float) -> Path:
        sched, res = policy_schedule(
            profile,
            policy,
            budget=budget,
            phases=phases,
            seed=opts.seed,
            time_limit=opts.time_limit,
        )
        predicted[(policy, budget)] = res
        path = out_dir / "schedules" / f"{policy}-b{budget:g}.yaml"
        save_schedule(sched, path)
        return path

    def run(policy: Policy, budget: float, repeat: int, tag: str) -> Run:
        sched = schedule_for(policy, budget)
        rdir = out_dir / "runs" / f"{tag}-{policy}-b{budget:g}-r{repeat}"
        train_job(
            job,
            schedule_path=sched,
            steps=opts.steps,
            out_dir=rdir,
            warmup_steps=opts.warmup_steps,
            full_update_every=0,
            val_every=opts.val_every,
            keep_checkpoints=1,
            progress=progress,
        )
        return _read_run(
            rdir, policy=policy, budget=budget, repeat=repeat, warmup=opts.warmup_steps
        )

    runs: list[Run] = []
    for r in range(opts.repeats):
        order = list(
            opts.policies[r % len(opts.policies) :] + opts.policies[: r % len(opts.policies)]
        )
        for policy in order:
            runs.append(run(policy, opts.budget, r, "main"))
    sweep: list[Run] = []
    for b in opts.sweep:
        for policy in opts.policies:
            if policy in ("none", "timelyfreeze"):
                continue  # no budget to sweep
            sweep.append(run(policy, b, 0, "sweep"))

    results = _aggregate(runs, predicted, opts)
    report = CompareReport(
        job=job.name if isinstance(job, Job) else str(job),
        out_dir=str(out_dir),
        options=asdict(opts),
        results=results,
        runs=tuple(runs),
        sweep=tuple(sweep),
    )
    _write_outputs(report, out_dir)
    return report


def load_compare(out_dir: Path) -> CompareReport:
    """Read back the `results.json` a comparison wrote."""
    d = json.loads((Path(out_dir) / "results.json").read_text())

    def run(r: dict[str, Any]) -> Run:
        return Run(
            **{
                **r,
                "curve": tuple(map(tuple, r["curve"])),
                "loss_curve": tuple(map(tuple, r["loss_curve"])),
            }
        )

    return CompareReport(
        job=d["job"],
        out_dir=d["out_dir"],
        options=d["options"],
        results=tuple(PolicyResult(**r) for r in d["results"]),
        runs=tuple(run(r) for r in d["runs"]),
        sweep=tuple(run(r) for r in d["sweep"]),
        warnings=tuple(d.get("warnings", ())),
    )


def _read_run(rdir: Path, *, policy: str, budget: float, repeat: int, warmup: int) -> Run:
    metrics = [
        json.loads(line)
        for line in (rdir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    report = json.loads((rdir / "report.json").read_text())
    metrics = [m for m in metrics if "step_ms" in m]  # validation records carry only val_loss
    times, t = [], 0.0
    by_step: dict[int, float] = {}
    for m in metrics:
        t += m["step_ms"] / 1000.0
        by_step[int(m["step"])] = t
        times.append((t, float(m["loss"])))
    measured = [m["step_ms"] for m in metrics if int(m["step"]) >= warmup]
    curve = tuple(
        (by_step.get(int(s) - 1, 0.0) if s > 0 else 0.0, float(v))
        for s, v in report.get("val_losses", [])
    )
    tail = [x for _, x in times[-10:]]
    return Run(
        policy=policy,
        budget=budget,
        repeat=repeat,
        step_ms=statistics.median(measured),
        loss=statistics.fmean(tail),
        val_loss=float(report["val_loss"]),
        curve=curve,
        loss_curve=tuple(times),
        out_dir=str(rdir),
    )


def _aggregate(
    runs: list[Run], predicted: dict[tuple[str, float], Any], opts: CompareOptions
) -> tuple[PolicyResult, ...]:
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.policy, []).append(r)
    none_ms = statistics.median(r.step_ms for r in by["none"])
    target = statistics.median(r.val_loss for r in by["none"])
    base_pred = predicted[("none", opts.budget)].predicted_ms
    scale = none_ms / base_pred if base_pred else 1.0  # the DAG's ms on this machine's clock
    out = []
    for policy in opts.policies:
        rs = by[policy]
        pred = predicted[(policy, opts.budget)]
        ms = statistics.median(r.step_ms for r in rs)
        lp_ms = pred.lp_bound_ms * scale
        room = none_ms - lp_ms
        reach = [_time_to(r.curve, target) for r in rs]
        reached = [x for x in reach if x is not None]
        out.append(
            PolicyResult(
                policy=policy,
                step_ms=ms,
                ratio=ms / none_ms,
                predicted_ms=pred.predicted_ms,
                predicted_ratio=pred.predicted_ms / base_pred if base_pred else 1.0,
                lp_bound_ms=pred.lp_bound_ms,
                gain_captured=(none_ms - ms) / room if policy != "none" and room > 1e-9 else None,
                signal_dropped=pred.signal_dropped,
                loss=statistics.median(r.loss for r in rs),
                val_loss=statistics.median(r.val_loss for r in rs),
                time_to_target_s=statistics.median(reached) if len(reached) == len(reach) else None,
            )
        )
    return tuple(out)


def _time_to(curve: tuple[tuple[float, float], ...], target: float) -> float | None:
    for t, v in curve:
        if v <= target + 1e-9:
            return t
    return None


def format_compare(rep: CompareReport) -> str:
    """The results table as Markdown."""
    none = next(r for r in rep.results if r.policy == "none")
    lines = [
        "| policy | step ms (measured) | × none | predicted ms | × none (predicted) | LP-bound gain captured | signal dropped | train loss | val loss | time to none's val loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rep.results:
        gain = "—" if r.gain_captured is None else f"{100 * r.gain_captured:.0f} %"
        reach = "never" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f} s"
        lines.append(
            f"| {r.policy} | {r.step_ms:.1f} | {r.ratio:.3f} | {r.predicted_ms:.1f} | {r.predicted_ratio:.3f} | {gain} | "
            f"{100 * r.signal_dropped:.1f} % | {r.loss:.3f} | {r.val_loss:.3f} | {reach} |"
        )
    lines.append("")
    lines.append(
        f"Reference: `none` at {none.step_ms:.1f} ms per step, final validation loss {none.val_loss:.3f}."
    )
    return "\n".join(lines)


def _write_outputs(rep: CompareReport, out_dir: Path) -> None:
    atomic_write_text(
        out_dir / "results.json", json.dumps(asdict(rep), indent=1, default=str) + "\n"
    )
    figs = {"loss_vs_time.png": _loss_figure(rep)}
    if rep.sweep:
        figs["budget_sweep.png"] = _sweep_figure(rep)
    import io

    for name, fig in figs.items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
        atomic_write_bytes(out_dir / name, buf.getvalue())
    md = [
        f"# freezeopt compare: {rep.job}",
        "",
        f"Options: `{json.dumps(rep.options, sort_keys=True)}`",
        "",
        format_compare(rep),
        "",
        "![loss against training time](loss_vs_time.png)",
    ]
    if rep.sweep:
        md += ["", "![budget sweep](budget_sweep.png)"]
    atomic_write_text(out_dir / "report.md", "\n".join(md) + "\n")


def _loss_figure(rep: CompareReport) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for run in rep.runs:
        if run.repeat:
            continue
        xs = [t for t, _ in run.loss_curve]
        ys = _smooth([v for _, v in run.loss_curve])
        (line,) = ax.plot(xs, ys, lw=1, alpha=0.6, label=f"{run.policy} (train)")
        if run.curve:
            ax.plot(
                [t for t, _ in run.curve],
                [v for _, v in run.curve],
                "o-",
                color=line.get_color(),
                lw=1.5,
                label=f"{run.policy} (val)",
            )
    ax.set_xlabel("training time (s, sum of step times)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, ncols=2)
    ax.grid(alpha=0.3)
    return fig


def _sweep_figure(rep: CompareReport) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    by: dict[str, list[Run]] = {}
    for r in rep.sweep:
        by.setdefault(r.policy, []).append(r)
    for policy, rs in by.items():
        rs = sorted(rs, key=lambda r: r.budget)
        ax.plot([r.step_ms for r in rs], [r.val_loss for r in rs], "o-", label=policy)
        for r in rs:
            ax.annotate(f"{r.budget:g}", (r.step_ms, r.val_loss), fontsize=6)
    for r in rep.runs:
        if r.policy in ("none", "timelyfreeze") and r.repeat == 0:
            ax.plot([r.step_ms], [r.val_loss], "s", label=r.policy)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("final validation loss")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _smooth(xs: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1) : i + 1]
        out.append(sum(w) / len(w))
    return out
