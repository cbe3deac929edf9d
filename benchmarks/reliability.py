"""The reliability report: every fault class freezeopt is tested against, how many cases, the
outcome, and how long detection took. Written to benchmarks/reliability.md by `make reliability`.

Three parts:
* input fuzzing — the hypothesis suite in tests/test_fuzz.py, run with many more examples; every
  case's outcome (success or the documented error) is logged and counted here;
* edge faults — solver missing or failing, full disk, files that try to run code
  (tests/test_faults.py), run through pytest and counted from its JUnit report;
* distributed faults — real multi-process runs of `freezeopt profile` with a rank that crashes,
  is killed (SIGKILL), or hangs, a rendezvous port already in use, and freezeopt itself told to
  stop (SIGTERM) or killed (SIGKILL): time to detect, the error, no profile written, no process
  left behind;
* training faults — real `freezeopt train` runs of the built-in job replaying a solved schedule,
  each with one fault (exploding loss, NaN loss, corrupted batches, a slowed stage, a damaged
  checkpoint under a rollback, a crashed rank then `--resume`, a damaged newest checkpoint then
  `--resume`): when it was caught, what the controller did, the steps lost, and the final
  validation loss against the no-fault run's, within the schedule's budget.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from procs import alive, children  # benchmarks/procs.py, beside this script

ROOT = Path(__file__).resolve().parent.parent


def run_pytest(
    args: list[str], env: dict[str, str], junit: Path, *, qualified: bool = False
) -> tuple[int, dict[str, tuple[str, float]]]:
    """Run pytest; return its exit code and per-test (outcome, seconds) from the JUnit report,
    by test name (`qualified`: by `path::name`, as pytest's node ids)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    rc = proc.returncode
    results: dict[str, tuple[str, float]] = {}
    if not junit.exists():  # pytest never got to write its report: say why, not a traceback
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [f"exit {rc}"]
        results[f"pytest {' '.join(args)} (no report: {tail[0][:120]})"] = ("FAILED", 0.0)
        return rc or 1, results
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "FAILED"
            elif child.tag == "skipped":
                outcome = "skipped"
        name = case.get("name", "?")
        if qualified:
            name = case.get("classname", "").replace(".", "/") + ".py::" + name
        results[name] = (outcome, float(case.get("time", 0)))
    return rc, results


def fuzz_section(examples: int, tmp: Path) -> tuple[list[str], bool]:
    log = tmp / "fuzz.jsonl"
    env = {**os.environ, "FREEZEOPT_FUZZ_EXAMPLES": str(examples), "FREEZEOPT_FUZZ_LOG": str(log)}
    t0 = time.perf_counter()
    rc, results = run_pytest(["tests/test_fuzz.py"], env, tmp / "fuzz.xml")
    wall = time.perf_counter() - t0
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    if log.exists():
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            counts[rec["test"]][rec["outcome"]] += 1
    lines = [
        "## Input fuzzing",
        "",
        f"`FREEZEOPT_FUZZ_EXAMPLES={examples} pytest tests/test_fuzz.py` ({wall:.0f} s). Files are mutated "
        "valid documents (values replaced by random JSON of any type, keys deleted or added, numbers "
        "altered, text truncated or spliced with `\\0`, `{`, YAML tags, anchors, huge exponents). The only "
        "allowed outcomes are success or a documented one-line error; a traceback or any other "
        "exception fails the suite.",
        "",
        "| target | cases | outcomes | other exceptions |",
        "|---|---:|---|---:|",
    ]
    total = 0
    for target in sorted(counts):
        c = counts[target]
        n = sum(c.values())
        total += n
        outs = ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"| {target} | {n} | {outs} | 0 |")
    failed = [name for name, (o, _) in results.items() if o == "FAILED"]
    lines += [
        f"| **total** | **{total}** | | **{len(failed)} failing tests** |",
        "",
        "Also: a 300 MiB profile and a 20 MiB schedule are refused as too large; JSON and YAML nested "
        "100,000 and 20,000 deep are refused without a stack overflow "
        f"({'passed' if all(results.get(n, ('?',))[0] == 'passed' for n in ('test_oversized_files_are_refused', 'test_deep_nesting_is_refused')) else 'FAILED'}).",
        "",
    ]
    return lines, rc == 0


def faults_section(tmp: Path) -> tuple[list[str], bool]:
    rc, results = run_pytest(["tests/test_faults.py"], dict(os.environ), tmp / "faults.xml")
    lines = [
        "## Edge faults",
        "",
        "`pytest tests/test_faults.py`: injected, each checked for the exit code, a one-line message, "
        "no traceback, and the previous file left intact.",
        "",
        "| case | outcome | seconds |",
        "|---|---|---:|",
    ]
    for name, (outcome, secs) in sorted(results.items()):
        lines.append(f"| `{name}` | {outcome} | {secs:.2f} |")
    lines.append("")
    return lines, rc == 0


CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "work lost: an earlier run's checkpoints, outputs replaced half-written or by each other",
        (
            "tests/training/test_checkpoint.py::test_a_fresh_run_refuses_a_folder_holding_an_earlier_run",
            "tests/test_inputs.py::test_write_model_is_checked_like_every_output_and_written_atomically",
            "tests/test_faults.py::test_full_disk_leaves_the_previous_file",
        ),
    ),
    (
        "numbers that break the arithmetic (NaN, inf, 1e308, all-zero costs) refused where they enter; nothing written fails its own validation",
        (
            "tests/formats/test_profile.py::test_a_non_finite_number_anywhere_is_refused_naming_its_field",
            "tests/formats/test_profile.py::test_values_past_what_the_arithmetic_stands_are_refused_with_the_reason",
            "tests/formats/test_profile.py::test_values_at_the_limits_load",
            "tests/formats/test_profile.py::test_all_zero_action_costs_are_refused_and_zero_group_costs_load",
            "tests/formats/test_profile.py::test_save_profile_never_writes_what_the_loader_refuses",
            "tests/formats/test_schedule.py::test_a_non_finite_number_is_refused_naming_its_field",
            "tests/formats/test_schedule.py::test_a_prediction_past_any_step_a_profile_can_give_is_refused",
            "tests/torchpp/test_job.py::test_non_finite_and_out_of_range_numbers_are_refused_at_load",
            "tests/test_inputs.py::test_a_profile_with_non_finite_or_degenerate_numbers_is_refused_by_every_command",
            "tests/test_inputs.py::test_synth_refuses_costs_its_profile_could_not_hold",
            "tests/test_inputs.py::test_a_job_spec_with_a_non_finite_argument_is_refused_before_any_rank_starts",
            "tests/test_inputs.py::test_a_schedule_with_a_prediction_past_any_step_is_refused",
            "tests/test_inputs.py::test_a_plan_that_freezes_the_whole_step_away_is_reported_not_divided_by",
            "tests/test_fuzz.py::test_what_solve_writes_from_an_edge_profile_validates_against_it",
            "tests/profiling/test_run.py::test_a_nan_loss_stops_profiling_at_that_step_with_one_line_and_exit_6",
        ),
    ),
    (
        "processes left behind: no child of freezeopt outlives it, whatever signal ends it; its temp files go",
        ("tests/test_procs.py",),
    ),
    (
        "a schedule for another model: group fingerprints refused on a mismatch",
        (
            "tests/formats/test_schedule.py::test_fingerprints_are_copied_and_a_profile_of_another_model_is_refused",
            "tests/training/test_runtime.py::test_groups_of_another_width_are_refused_with_one_line",
            "tests/training/test_runtime.py::test_a_replan_with_fingerprints_replaces_a_plan_without",
            "tests/torchpp/test_freezing.py::test_enable_freezing_has_the_controller_check_the_groups",
            "tests/profiling/test_run.py::test_fingerprints_go_into_the_schedule_and_refuse_a_model_of_another_width",
            "tests/training/test_train.py::test_the_ranks_check_the_fingerprints_of_a_model_the_meta_device_cannot_build",
        ),
    ),
    (
        "a non-finite training loss: a drift event, and a run that never recovers exits non-zero",
        (
            "tests/training/test_train.py::test_a_run_that_never_recovers_from_a_nan_loss_says_so_and_exits_non_zero",
            "tests/training/test_train.py::test_nan_loss_rolls_back_past_a_corrupted_checkpoint",
        ),
    ),
    (
        "code run from a file: checkpoints load weights only; damaged ones are skipped",
        (
            "tests/training/test_checkpoint.py::test_a_rank_file_that_would_run_code_is_refused_not_run",
            "tests/training/test_checkpoint.py::test_resume_falls_back_past_a_checkpoint_that_does_not_load",
            "tests/training/test_checkpoint.py::test_a_malformed_meta_json_is_skipped_or_named_never_a_traceback",
            "tests/test_faults.py::test_files_are_data_only",
        ),
    ),
    (
        "resources: sizes bounded before allocation, inputs that are not regular files, expansion bombs",
        (
            "tests/test_inputs.py::test_sizes_are_bounded_before_anything_is_allocated",
            "tests/test_inputs.py::test_solver_threads_are_bounded",
            "tests/test_inputs.py::test_an_input_that_is_not_a_regular_file_is_refused_not_read",
            "tests/test_inputs.py::test_a_csv_through_a_link_to_a_device_is_refused",
            "tests/test_inputs.py::test_an_output_that_is_a_device_or_fifo_is_never_replaced",
            "tests/test_inputs.py::test_a_yaml_alias_bomb_is_refused_quickly",
            "tests/test_inputs.py::test_a_schedule_of_huge_ranges_validates_without_expanding_them",
        ),
    ),
    (
        "the contract: name lengths, one-line errors, versions, duplicate and merge keys, the cause of a stage's error",
        (
            "tests/test_inputs.py::test_an_output_name_of_legal_length_is_written_and_a_longer_one_refused_first",
            "tests/test_inputs.py::test_a_newline_in_a_path_keeps_the_error_on_one_line",
            "tests/test_inputs.py::test_schema_version_true_is_not_version_1",
            "tests/test_inputs.py::test_a_key_given_twice_in_a_json_profile_is_refused",
            "tests/test_inputs.py::test_yaml_merge_keys_are_read_and_own_keys_win",
            "tests/torchpp/test_launch.py::test_a_wrapped_error_keeps_its_cause_on_the_one_line",
        ),
    ),
    (
        "timing as torch runs it: the DAG against torch's runtime in virtual time, every schedule",
        ("tests/torchpp/test_torch_timing.py",),
    ),
    (
        "wrapped stages (FSDP, FSDP2, DDP) refused, never frozen wrongly",
        (
            "tests/torchpp/test_freezing.py::test_stages_wrapped_by_fsdp2_or_ddp_are_refused_not_frozen_wrongly",
        ),
    ),
    (
        "own loop: phase overrides, a drift rule without its inputs warns",
        (
            "tests/training/test_runtime.py::test_phase_overrides_in_the_controller",
            "tests/training/test_runtime.py::test_end_step_without_the_inputs_of_a_drift_rule_warns_once",
        ),
    ),
)
"""Each fault class of the reliability issue and the tests that cover it (run by `classes_section`)."""

WALL_CLOCK = (
    "tests/solver/test_highs_child.py::test_child_is_stopped_at_the_deadline",
    "tests/solver/test_highs_child.py::test_child_that_stops_on_its_own_time_limit_hands_back_its_incumbent",
    "tests/solver/test_pulp_run.py",
    "tests/solver/test_modes.py::test_time_limit_is_reported_honestly",
    "tests/solver/test_modes.py::test_milp_with_cbc_does_not_start_when_its_root_lp_would_outlast_the_deadline",
    "tests/training/test_replan.py::test_replan_on_a_split_backward_schedule",
    "tests/training/test_replan.py::test_periodic_replan_moves_freezing_to_a_slowed_stage",
)
"""Tests whose outcome once depended on the host's speed; `hog_section` runs them beside busy
processes."""


def classes_section(tmp: Path) -> tuple[list[str], bool]:
    ids = sorted({t for _, tests in CLASSES for t in tests})
    rc, results = run_pytest(ids, dict(os.environ), tmp / "classes.xml", qualified=True)
    lines = [
        "## Fault classes and the tests that cover them",
        "",
        "Each class of the reliability issue, run as `pytest <its tests>` (parametrised tests count "
        "each case).",
        "",
        "| class | tests | passed | failed |",
        "|---|---:|---:|---:|",
    ]
    ok = rc == 0
    for title, tests in CLASSES:
        mine = {
            k: o
            for k, (o, _) in results.items()
            if any(k == t or k.startswith((t + "[", t + "::")) for t in tests)
        }
        passed = sum(o == "passed" for o in mine.values())
        failed = sum(o == "FAILED" for o in mine.values())
        ok = ok and failed == 0 and passed > 0
        lines.append(f"| {title} | {len(mine)} | {passed} | {failed} |")
    lines.append("")
    return lines, ok


def hog_section(tmp: Path, busy: int) -> tuple[list[str], bool]:
    """The wall-clock-sensitive tests beside `busy` spinning processes."""
    import multiprocessing as mp

    procs = [mp.Process(target=_spin, daemon=True) for _ in range(busy)]
    for p in procs:
        p.start()
    try:
        t0 = time.perf_counter()
        rc, results = run_pytest(list(WALL_CLOCK), dict(os.environ), tmp / "hog.xml")
        wall = time.perf_counter() - t0
        load = os.getloadavg()[0]
    finally:
        for p in procs:
            p.kill()
            p.join()
    lines = [
        "## Tests that once depended on the host's speed, beside busy processes",
        "",
        f"{busy} processes spinning on {os.cpu_count()} cores while pytest ran ({wall:.0f} s, load "
        f"average {load:.1f} at the end). Each of these failed on a loaded host before its outcome was "
        "made independent of wall-clock speed.",
        "",
        "| test | outcome | seconds |",
        "|---|---|---:|",
    ]
    for name, (outcome, secs) in sorted(results.items()):
        lines.append(f"| `{name}` | {outcome} | {secs:.2f} |")
    lines.append("")
    return lines, rc == 0


def _spin() -> None:
    while True:
        pass


def distributed_section(tmp: Path, faults: list[str]) -> tuple[list[str], bool]:
    from freezeopt.errors import FreezeoptError
    from freezeopt.profiling.run import profile_job
    from freezeopt.torchpp.job import load_job, replace_job

    job = replace_job(
        load_job("tiny-gpt"),
        measure_steps=4,
        warmup_steps=1,
        cost_samples=3,
        lag_samples=5,
        val_batches=1,
        hang_timeout_s=10,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        data_args={"max_train_bytes": 200000, "max_val_bytes": 20000, "val_every": 10},
    )
    lines = [
        "## Distributed faults (`freezeopt profile`, 2 ranks, gloo)",
        "",
        "A real 2-rank profile of a small tiny-gpt with a fault injected in one rank. Checked: the error "
        "names the rank and cause, no profile file is written, and no rank process outlives the call. "
        "`parent-sigterm` / `parent-sigkill`: `freezeopt profile` in its own process is sent SIGTERM "
        "(it must stop its ranks, exit 143 with one line) or SIGKILL (the kernel must end its ranks); "
        "the time is from the signal until no rank is left.",
        "",
        "| fault | detected in | error | file written | processes left |",
        "|---|---:|---|---|---:|",
    ]
    ok = True
    for fault in faults:
        out = tmp / f"{fault.replace(':', '_').replace(',', '_')}.json"
        before = children(os.getpid(), zombies=True)
        t0 = time.perf_counter()
        taken = None
        try:
            if fault.startswith("parent-"):  # freezeopt itself told to stop, or killed
                import signal

                sig = signal.SIGTERM if fault == "parent-sigterm" else signal.SIGKILL
                msg, good, n_left, dt_sig = _parent_signal(tmp, job, sig)
                ok = ok and good
                lines.append(
                    f"| `{fault}` | {dt_sig:.1f} s | {msg[:140]} | {'yes' if (tmp / 'long.json').exists() else 'no'} | {n_left} |"
                )
                continue
            if fault == "port-in-use":  # the rendezvous port is already bound by someone else
                import socket

                import freezeopt.torchpp.launch as launch

                taken = socket.socket()
                taken.bind(("127.0.0.1", 0))
                taken.listen(1)
                port = taken.getsockname()[1]
                launch._free_port = lambda port=port: port  # type: ignore[assignment,misc]
                profile_job(job, out=out, progress=False)
            else:
                profile_job(job, out=out, progress=False, fault=fault)
            msg, good = "no error raised", False
        except FreezeoptError as e:
            msg, good = str(e), True
        finally:
            if taken is not None:
                taken.close()
        dt = time.perf_counter() - t0
        left = children(os.getpid(), zombies=True) - before
        good = good and not out.exists() and not left
        ok = ok and good
        short = msg if len(msg) < 140 else msg[:137] + "..."
        lines.append(
            f"| `{fault}` | {dt:.1f} s | {short} | {'yes' if out.exists() else 'no'} | {len(left)} |"
        )
    lines.append("")
    return lines, ok


def _parent_signal(tmp: Path, job: object, sig: int) -> tuple[str, bool, int, float]:
    """`freezeopt profile` in its own process, sent `sig` once both ranks run: (message, handled,
    ranks left alive after 10 s, seconds from the signal until no rank is left)."""
    import signal

    import yaml

    from freezeopt.torchpp.job import replace_job

    spec = tmp / "long.yaml"
    spec.write_text(yaml.safe_dump(replace_job(job, measure_steps=10_000).to_dict()))  # type: ignore[arg-type]
    out = tmp / "long.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "freezeopt", "profile", str(spec), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ranks: set[int] = set()
    deadline = time.monotonic() + 120
    while len(ranks) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        ranks = children(proc.pid)
    time.sleep(3)
    t0 = time.perf_counter()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    while alive(ranks) and time.perf_counter() - t0 < 10:
        time.sleep(0.1)
    dt = time.perf_counter() - t0
    left = len(alive(ranks))
    text = err.decode(errors="replace").strip().splitlines()
    last = text[-1] if text else f"exit {proc.returncode}"
    if sig == signal.SIGKILL:
        msg = f"parent killed (exit {proc.returncode}); ranks ended by the kernel"
        good = len(ranks) == 2 and left == 0
    else:
        msg = f"exit {proc.returncode}: {last}"
        good = (
            len(ranks) == 2
            and proc.returncode == 128 + sig
            and "Traceback" not in err.decode(errors="replace")
            and left == 0
        )
    return msg, good and not out.exists(), left, dt


TRAIN_FAULTS = (  # (name, fault, what it stands for, other TrainOptions fields)
    ("none", "", "the reference: no fault", {}),
    ("exploding loss", "lr_spike:step=50,factor=1000", "one step with 1000× the learning rate", {}),
    ("NaN loss", "nan_loss:step=50", "the loss of one step is NaN", {}),
    ("corrupted batches", "corrupt_batch:step=50,steps=3", "3 batches of random bytes", {}),
    (
        "slowed stage",
        "slow:stage=1,ms=40,step=50",
        "stage 1 spins 40 ms per action from step 50",
        {},
    ),
    (
        "damaged checkpoint",
        "corrupt_checkpoint:step=60,rank=1;nan_loss:step=60",
        "rank 1's newest checkpoint file damaged, then a NaN loss (rollback)",
        {},
    ),
)


def training_section(tmp: Path, steps: int) -> tuple[list[str], bool]:
    """Real training runs of the built-in job with one fault each (module docstring)."""
    import shutil
    from dataclasses import replace

    from freezeopt.commands import solve_file
    from freezeopt.errors import FreezeoptError
    from freezeopt.formats.schedule import Phases
    from freezeopt.profiling.run import profile_job
    from freezeopt.solver import SolveOptions
    from freezeopt.torchpp.faults import damage_file
    from freezeopt.torchpp.job import load_job
    from freezeopt.training.options import CheckpointOptions, TrainOptions
    from freezeopt.training.train import train_job

    job = load_job("tiny-gpt")
    prof, sched = tmp / "tiny-gpt.json", tmp / "tiny-gpt.yaml"
    profile_job(job, out=prof, progress=False)
    budget = 0.1
    solve_file(
        prof, SolveOptions(mode="milp", budget=budget), phases=Phases(warmup_steps=10), out=sched
    )
    common = TrainOptions(
        out_dir=tmp,
        schedule=sched,
        steps=steps,
        progress=False,
        checkpoints=CheckpointOptions(rollback=True, every=20),
        val_every=20,
    )
    lines = [
        "## Training faults (`freezeopt train`, built-in job, 2 ranks)",
        "",
        f"The built-in job (tiny-gpt, 1F1B, 2 ranks) profiled, solved at budget {budget} "
        f"(`milp`, 10 full-update warm-up steps) and trained {steps} steps with `--rollback`, "
        "a checkpoint every 20 steps and validation every 20, once per fault. A run passes when "
        "the fault is caught (a drift, a detected corruption or a named failure), nothing raises a "
        "traceback, and its final validation loss keeps at least (1 − budget) of the no-fault run's "
        "progress: `val ≤ val_ref + budget · (val_start − val_ref)`, with `val_start` the loss at "
        "step 0 (from the profile: same seed, same initial weights). `caught` is the step of the first "
        "drift or corruption event at or after the fault; `before` counts drifts earlier than that "
        "(the step-time rule on a busy machine, say), which fall back but never roll back.",
        "",
        "| fault | injected | caught at | rules / events from then on | drifts before | fallbacks | rollbacks | steps lost | val loss | no-fault val | limit | result |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ok = True
    ref_val = start_val = None
    doc = json.loads(prof.read_text())  # the validation loss before any training (same init)
    at = doc["extra"].get("val_loss_at_step", [])
    start_val = doc["val_loss"][0] if at and at[0] == 0 else None
    for name, fault, what, extra in TRAIN_FAULTS:
        out = tmp / f"train-{name.replace(' ', '-')}"
        rep = train_job(job, replace(common, out_dir=out, fault=fault or None, **extra))
        caught, rules = _caught(rep.events, _fault_step(fault))
        val = rep.val_loss
        if name == "none":
            ref_val = val
        limit = _limit(ref_val, start_val, budget)
        good = val is not None and limit is not None and val <= limit
        good = good and (name == "none" or caught is not None)
        ok = ok and good
        lines.append(
            f"| {name} | `{fault or '—'}` ({what}) | {caught if caught is not None else '—'} | "
            f"{rules or '—'} | {_before(rep.events, _fault_step(fault) if fault else steps)} | "
            f"{rep.fallbacks} | {rep.rollbacks} | 0 | {_f(val)} | {_f(ref_val)} | "
            f"{_f(limit)} | {'pass' if good else 'FAIL'} |"
        )
    # a crashed rank, then --resume; and a damaged newest checkpoint found by --resume
    for name, damage in (
        ("crashed rank, resumed", False),
        ("crash + damaged checkpoint, resumed", True),
    ):
        out = tmp / f"train-{'crash-damaged' if damage else 'crash'}"
        fault = "crash:rank=1,step=65"
        try:
            train_job(job, replace(common, out_dir=out, fault=fault))
            msg = "no error raised"
        except FreezeoptError as e:
            msg = str(e)
        if damage:
            newest = sorted((out / "checkpoints").glob("step-*"))[-1]
            damage_file(newest / "rank1.pt")
        resume = replace(common.checkpoints, resume=True)
        rep = train_job(job, replace(common, out_dir=out, checkpoints=resume))
        lost = 65 - rep.start_step
        _, rules = _caught(rep.events, rep.start_step)
        val = rep.val_loss
        limit = _limit(ref_val, start_val, budget)
        good = (
            msg.startswith("rank 1 ")
            and "\n" not in msg
            and val is not None
            and limit is not None
            and val <= limit
            and lost <= (45 if damage else 25)
        )
        ok = ok and good
        evs = "resume" + (f", {rules}" if rules else "")
        lines.append(
            f"| {name} | `{fault}`{' + rank 1 file of the newest checkpoint damaged' if damage else ''} | "
            f"65 (launcher) | {evs} | — | {rep.fallbacks} | {rep.rollbacks} | "
            f"{lost} (resumed at {rep.start_step}) | {_f(val)} | {_f(ref_val)} | {_f(limit)} | "
            f"{'pass' if good else 'FAIL'} |"
        )
        shutil.rmtree(out, ignore_errors=True)
    lines += [
        "",
        "`steps lost`: steps trained again after a resume (the crash step minus the checkpoint "
        "resumed from); a rollback keeps the step count and restores the weights of the newest "
        "intact checkpoint instead.",
        "",
    ]
    return lines, ok


def _fault_step(fault: str) -> int:
    steps = [int(m) for m in re.findall(r"step=(\d+)", fault)]
    return min(steps) if steps else 0


def _caught(events: tuple[dict, ...], since: int) -> tuple[int | None, str]:
    """The step of the first drift or corruption event from step `since` on, and what fired from
    then on (gradient-spike rules summed up over groups)."""
    late = [e for e in events if e["step"] >= since]
    hits = [e for e in late if e["event"] in ("drift", "checkpoint_corrupt")]
    names = [r for e in hits for r in e.get("rules", ["checkpoint_corrupt"])]
    spikes = {r for r in names if r.startswith("grad_norm_spike:")}
    rules = {r for r in names if r not in spikes}
    if spikes:
        rules.add(f"grad_norm_spike ({len(spikes)} groups)")
    rules |= {e["event"] for e in late if e["event"] in ("rollback", "rollback_skipped")}
    return (hits[0]["step"] if hits else None), ", ".join(sorted(rules))


def _before(events: tuple[dict, ...], step: int) -> int:
    return sum(1 for e in events if e["event"] == "drift" and e["step"] < step)


def _limit(ref: float | None, start: float | None, budget: float) -> float | None:
    if ref is None or start is None:
        return None
    return ref + budget * (start - ref)


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reliability.md")
    ap.add_argument("--examples", type=int, default=2500, help="hypothesis examples per fuzz test")
    ap.add_argument("--train-steps", type=int, default=100, help="steps per training-fault run")
    ap.add_argument(
        "--only",
        default="fuzz,edge,classes,hog,distributed,training",
        help="sections to run (comma-separated)",
    )
    ap.add_argument("--busy", type=int, default=4, help="spinning processes beside the hog section")
    args = ap.parse_args()
    only = set(args.only.split(","))
    faults = [
        "crash:rank=1,step=2",
        "kill:rank=1,step=2",
        "hang:rank=1,step=1",
        "port-in-use",
        "parent-sigterm",
        "parent-sigkill",
    ]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        skipped: list[str] = []
        fuzz, ok1 = fuzz_section(args.examples, tmp) if "fuzz" in only else (skipped, True)
        edge, ok2 = faults_section(tmp) if "edge" in only else (skipped, True)
        classes, ok5 = classes_section(tmp) if "classes" in only else (skipped, True)
        hog, ok6 = hog_section(tmp, args.busy) if "hog" in only else (skipped, True)
        ok2 = ok2 and ok5 and ok6
        edge = edge + classes + hog
        dist, ok3 = distributed_section(tmp, faults) if "distributed" in only else (skipped, True)
        train, ok4 = (
            training_section(tmp, args.train_steps) if "training" in only else (skipped, True)
        )
        ok3 = ok3 and ok4
        dist = dist + train
        wall = time.perf_counter() - t0
    head = [
        "# Reliability report",
        "",
        f"Written by `make reliability` (`python benchmarks/reliability.py --examples {args.examples}`) in "
        f"{wall / 60:.1f} min on {os.cpu_count()} cores, at commit {_commit()} on {time.strftime('%Y-%m-%d')} "
        f"(load average at the end {os.getloadavg()[0]:.1f}). Verdict: "
        f"**{'all fault classes handled' if ok1 and ok2 and ok3 else 'FAILURES — see below'}** "
        "(zero tracebacks, zero partial files).",
        "",
    ]
    from freezeopt.fileio import atomic_write_text

    atomic_write_text(args.out, "\n".join(head + fuzz + edge + dist))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if ok1 and ok2 and ok3 else 1


if __name__ == "__main__":
    sys.exit(main())
