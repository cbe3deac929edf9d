"""torchtitan with a freeze schedule: measured step time against freezeopt's prediction.

Profiles torchtitan's llama3 debug model with torchtitan's own trainer in profile mode
(`freezeopt/examples/torchtitan-llama3-profile.toml`, pipeline degree 2) — or, with
`--profiler freezeopt`, as the built-in `torchtitan-llama3` job in freezeopt's runtime — solves it,
then runs torchtitan's own trainer (`python -m freezeopt.torchtitan`) with
the schedule on pipeline degree 2 — the profiled pipeline — and, with `--fsdp`, also on pipeline
degree 2 × FSDP2 shard degree 2 (4 ranks). Per layout and repeat, two runs in rotated order:
`none` (the controller kept in warm-up for the whole run: same trainer, same all-reduces, no
freezing) and `freeze` (warm-up 5 steps, then the schedule). Step time is each step's slowest
rank's pipeline step (`metrics.jsonl`, steps 8 on, freezing steps only); the report gives medians,
the measured speed-up against the predicted one (the schedule's baseline over its prediction), the
host's load, and the drift events. Written to benchmarks/torchtitan.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from freezeopt.fileio import atomic_write_text  # noqa: E402
from freezeopt.formats.schedule import load_schedule  # noqa: E402
from freezeopt.torchtitan.data import write_tokenizer  # noqa: E402

FROM_STEP = 8


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], **kw: Any) -> None:
    print("[bench]", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")


def _titan(
    work: Path, name: str, schedule: Path, shard: int, steps: int, warmup: int
) -> dict[str, Any]:
    run = work / name
    ranks = 2 * shard
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
        "--master_port", str(_port()), "-m", "freezeopt.torchtitan",
        "--job.config_file", str(ROOT / "freezeopt/examples/torchtitan-llama3.toml"),
        "--model.hf_assets_path", str(work / "tokenizer"), "--job.dump_folder", str(run),
        "--parallelism.data_parallel_shard_degree", str(shard), "--training.steps", str(steps),
        "--freeze.schedule", str(schedule), "--freeze.warmup_steps", str(warmup),
        "--freeze.full_update_every", "0", "--metrics.log_freq", "10",
    ]  # fmt: skip
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    _run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1800)
    rows = [json.loads(ln) for ln in (run / "freezeopt/metrics.jsonl").read_text().splitlines()]
    events = [json.loads(ln) for ln in (run / "freezeopt/events.jsonl").read_text().splitlines()]
    want = "freeze" if warmup < steps else "warmup"
    ms = [r["step_ms"] for r in rows if r["step"] >= FROM_STEP and r["phase"] == want]
    pred = [r["predicted_ms"] for r in rows if r["step"] >= FROM_STEP and r["predicted_ms"]]
    return {
        "median_ms": statistics.median(ms) if ms else None,
        "steps": len(ms),
        "predicted_ms": statistics.median(pred) if pred else None,
        "drifts": sum(e.get("event") == "drift" for e in events),
        "wall_s": round(time.monotonic() - t0, 1),
        "load": round(max(load0, os.getloadavg()[0]), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "torchtitan.md")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "bench-torchtitan")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--fsdp", action="store_true", help="also pipeline 2 × FSDP2 2 (4 ranks)")
    ap.add_argument(
        "--profiler",
        choices=("torchtitan", "freezeopt"),
        default="torchtitan",
        help="who measures the profile: torchtitan's trainer (profile mode) or freezeopt's runtime",
    )
    a = ap.parse_args()
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    write_tokenizer(work / "tokenizer")
    cli = [sys.executable, "-m", "freezeopt"]
    profile, schedule = work / "profile.json", work / "schedule.yaml"
    if a.profiler == "freezeopt":
        _run([*cli, "profile", "torchtitan-llama3", "-o", str(profile)], timeout=1800)
    else:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_port", str(_port()), "-m", "freezeopt.torchtitan", "--job.config_file",
            str(ROOT / "freezeopt/examples/torchtitan-llama3-profile.toml"),
            "--model.hf_assets_path", str(work / "tokenizer"),
            "--job.dump_folder", str(work / "profile-run"), "--freeze.profile", str(profile),
        ]  # fmt: skip
        _run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1800)
    # a fixed budget: the step-time prediction under test, not the time-to-quality choice
    solve = ["solve", str(profile), "--budget", str(a.budget), "--objective", "step"]
    _run([*cli, *solve, "--sensitivity", "gns", "-o", str(schedule)], timeout=600)
    pred = load_schedule(schedule).prediction
    layouts = [("pipeline 2", 1)] + ([("pipeline 2 × FSDP2 2", 2)] if a.fsdp else [])
    results: dict[str, Any] = {
        "predicted_speedup": pred.baseline_ms / pred.predicted_ms,
        "predicted_ms": pred.predicted_ms,
        "baseline_ms": pred.baseline_ms,
        "budget": a.budget,
        "steps": a.steps,
        "profiler": a.profiler,
        "layouts": {},
    }
    for label, shard in layouts:
        runs: dict[str, list[dict[str, Any]]] = {"none": [], "freeze": []}
        for r in range(a.repeats):
            order = ["none", "freeze"] if r % 2 == 0 else ["freeze", "none"]
            for pol in order:
                warmup = a.steps + 1 if pol == "none" else 5
                runs[pol].append(
                    _titan(work, f"s{shard}-{pol}-r{r}", schedule, shard, a.steps, warmup)
                )
        speed = [
            n["median_ms"] / f["median_ms"]
            for n, f in zip(runs["none"], runs["freeze"], strict=True)
            if n["median_ms"] and f["median_ms"]
        ]
        results["layouts"][label] = {
            "runs": runs,
            "speedup": {
                "median": statistics.median(speed) if speed else None,
                "min": min(speed, default=None),
                "max": max(speed, default=None),
            },
        }
    atomic_write_text(
        a.out.with_suffix(".json"), json.dumps(results, indent=1, sort_keys=True) + "\n"
    )
    atomic_write_text(a.out, _report(results))
    print(a.out)
    return 0


def _report(res: dict[str, Any]) -> str:
    lines = [
        "# torchtitan with a freeze schedule: step time, measured against predicted",
        "",
        "Written by `benchmarks/bench_torchtitan.py` (`make bench`). torchtitan 0.2.2's trainer "
        "(`python -m freezeopt.torchtitan`) on the llama3 debug model, CPU, gloo, 1F1B with 8 "
        f"microbatches, {res['steps']} steps; the schedule solved at a fixed budget of {res['budget']} (`--objective step --sensitivity gns`) from "
        + (
            "torchtitan's trainer in profile mode (pipeline 2, no FSDP2). "
            if res.get("profiler", "freezeopt") == "torchtitan"
            else "freezeopt's profile of the same stages in its own runtime (pipeline 2, no FSDP2). "
        )
        + "`none`: the same trainer "
        "kept in warm-up; `freeze`: the schedule from step 5. Medians over steps "
        f"{FROM_STEP}+ (freezing steps only), repeats in rotated order; load: the 1-minute load "
        "average, the larger of start and end (2 cores).",
        "",
        f"Predicted: {res['baseline_ms']:.1f} → {res['predicted_ms']:.1f} ms, "
        f"**{res['predicted_speedup']:.3f}×**.",
        "",
        "| layout | repeat | none (ms) | freeze (ms) | measured × | controller's prediction (ms) | drifts | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, lay in res["layouts"].items():
        for r, (n, f) in enumerate(zip(lay["runs"]["none"], lay["runs"]["freeze"], strict=True)):
            x = n["median_ms"] / f["median_ms"] if n["median_ms"] and f["median_ms"] else None
            lines.append(
                f"| {label} | {r} | {_f(n['median_ms'])} | {_f(f['median_ms'])} | {_f(x, 3)} | "
                f"{_f(f['predicted_ms'])} | {f['drifts']} | {max(n['load'], f['load'])} |"
            )
        s = lay["speedup"]
        lines.append(
            f"| **{label}** | median | | | **{_f(s['median'], 3)}** ({_f(s['min'], 3)}–{_f(s['max'], 3)}) | | | |"
        )
    lines += [
        "",
        "The controller's prediction is the schedule's, scaled by the run's own full-update steps "
        "(warm-up) once three have run. With FSDP2 on 4 ranks the 2 cores are oversubscribed "
        "twice over and FSDP2's collectives are not in the profile: that row shows the schedule "
        "running under FSDP2, not a calibrated prediction.",
        "",
    ]
    return "\n".join(lines)


def _f(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
