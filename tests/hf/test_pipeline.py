"""Hugging Face models through the normal commands on 2 gloo ranks: profile → solve → train for a
tiny random-init Llama and GPT-2; freezing exact against the unfrozen run; tied weights equal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("transformers", reason="needs the freezeopt[hf] extra (make test installs it)")

from freezeopt.commands import solve_file
from freezeopt.formats.profile import load_profile
from freezeopt.formats.schedule import Drift, Phases
from freezeopt.hf.model import build_model
from freezeopt.profiling.run import profile_job
from freezeopt.solver import SolveOptions
from freezeopt.torchpp.job import Job, parse_job
from freezeopt.training.options import CheckpointOptions, PhaseOverrides, TrainOptions
from freezeopt.training.train import TrainReport, train_job

pytestmark = pytest.mark.slow

CONFIG: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2},
    "gpt2": {"n_embd": 32, "n_layer": 2},
}


def tiny_job(arch: str) -> Job:
    return parse_job(
        {
            "name": f"hf-{arch}",
            "model": f"hf:{arch}",
            "model_args": {"config": CONFIG[arch]},
            "data": "hf-text",
            "data_args": {
                "root": "stdlib",
                "files": ["json/*.py", "email/*.py"],
                "tokenizer": "bytes",
                "max_train_tokens": 50_000,
                "max_val_tokens": 5_000,
            },
            "microbatches": 4,
            "batch_size": 8,
            "seq_len": 32,
            "warmup_steps": 1,
            "measure_steps": 2,
            "cost_samples": 3,
            "lag_samples": 5,
            "val_batches": 1,
            "hang_timeout_s": 60,
        }
    )


def states(report: TrainReport, after_step: int) -> dict[int, dict[str, Any]]:
    """rank → its state in the run's checkpoint taken after step `after_step`."""
    (ck,) = (Path(c) for c in report.checkpoints if Path(c).name == f"step-{after_step + 1:08d}")
    return {r: torch.load(ck / f"rank{r}.pt", weights_only=False) for r in range(2)}


def metrics(run: Path) -> list[dict[str, Any]]:
    """The run's per-step records (validation records left out)."""
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def profile_solve_train(arch: str, tmp: Path) -> tuple[str, Job, Path, TrainReport]:
    """profile → solve → train (steps 0-2, the first a full update, a checkpoint after each).

    It trains on the solved schedule with its frozen set replaced by a fixed one — the embedding
    in microbatches 0-1, the head in 2-3 — so that what the freezing steps do does not hang on
    what the solver made of a tiny profile's group costs (they can all be timing noise)."""
    job = tiny_job(arch)
    profile_job(job, out=tmp / "p.json", progress=False)
    solve_file(
        tmp / "p.json",
        SolveOptions(mode="milp", budget=0.3),
        phases=Phases(drift=Drift(step_time_error=1e6)),  # no step-time rule on a busy machine
        out=tmp / "s.yaml",
    )
    sched = yaml.safe_load((tmp / "s.yaml").read_text())
    sched["frozen"] = {0: {"embed": "0-1"}, 1: {"head": "2-3"}}
    sched["ratios"], sched["realisation"] = {}, {}
    (tmp / "train.yaml").write_text(yaml.safe_dump(sched, sort_keys=False))
    rep = train_job(
        job,
        TrainOptions(
            schedule=tmp / "train.yaml",
            steps=3,  # steps 0, 1, 2
            out_dir=tmp / "run",
            progress=False,
            phases=PhaseOverrides(warmup_steps=1),
            checkpoints=CheckpointOptions(every=1),
        ),
    )
    return arch, job, tmp, rep


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Job, Path, TrainReport]:
    return profile_solve_train("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Job, Path, TrainReport]:
    return profile_solve_train("gpt2", tmp_path_factory.mktemp("gpt2"))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_profile_solve_train(arch: str, request: pytest.FixtureRequest) -> None:
    _, _, tmp, rep = request.getfixturevalue(arch)
    prof = load_profile(tmp / "p.json")
    assert [[g.name for g in st.groups] for st in prof.stages] == [
        ["embed", "layers.0"],
        ["layers.1", "head"],
    ]
    assert all(g.weight_grad_ms.median >= 0 for st in prof.stages for g in st.groups)
    assert prof.provenance.job is not None and prof.provenance.job["model"] == f"hf:{arch}"
    data = prof.extra["data"]
    assert data["corpus"] == "hf-text" and len(data["train_sha256"]) == 64
    sched = yaml.safe_load((tmp / "s.yaml").read_text())
    assert sched["pipeline"]["groups"] == [["embed", "layers.0"], ["layers.1", "head"]]
    m = metrics(tmp / "run")
    assert [r["step"] for r in m] == [0, 1, 2] and m[0]["phase"] == "warmup"
    assert all(math.isfinite(r["loss"]) for r in m)
    assert rep.val_loss is not None and math.isfinite(rep.val_loss)


def test_tied_weights_stay_equal(gpt2: Any) -> None:
    """GPT-2's embedding (stage 0, rank 0) and LM head (stage 1, rank 1) share one weight: after
    every step (a full update, then freezing steps that freeze each copy in half the microbatches)
    the copies are equal."""
    _, job, tmp, rep = gpt2
    assert [r["freezing"] for r in metrics(tmp / "run")] == [False, True, True]
    torch.manual_seed(job.seed)
    init = build_model(source="gpt2", n_stages=2, seq_len=job.seq_len, config=CONFIG["gpt2"])
    w0 = dict(init.stages[0].named_parameters())["transformer.wte.weight"]
    for step in range(3):
        st = states(rep, step)
        wte, head = st[0]["model"][0]["transformer.wte.weight"], st[1]["model"][1]["lm_head.weight"]
        assert torch.equal(wte, head), step
        assert not torch.equal(wte, w0)  # trained, not merely left alone


def test_freezing_is_exact_against_the_unfrozen_run(llama: Any) -> None:
    """layers.0 frozen in every microbatch of step 0: its gradient None and its weights and
    optimizer state untouched, every other group's gradient and update bit-identical to the
    unfrozen step 0 of the solved run (its warm-up step)."""
    _, job, tmp, rep = llama
    sched = yaml.safe_load((tmp / "s.yaml").read_text())
    sched["frozen"] = {0: {"layers.0": f"0-{job.microbatches - 1}"}}
    sched["ratios"], sched["realisation"] = {}, {}
    (tmp / "frozen.yaml").write_text(yaml.safe_dump(sched, sort_keys=False))
    frozen = train_job(
        job,
        TrainOptions(
            schedule=tmp / "frozen.yaml",
            steps=1,  # step 0 only
            out_dir=tmp / "frozen",
            progress=False,
            phases=PhaseOverrides(warmup_steps=0, full_update_every=0),
        ),
    )
    full_norms = metrics(tmp / "run")[0]["grad_norms"]
    norms = metrics(tmp / "frozen")[0]["grad_norms"]
    assert set(full_norms) == {"0/embed", "0/layers.0", "1/layers.1", "1/head"}
    assert set(norms) == set(full_norms) - {"0/layers.0"}  # no gradient: no norm
    assert {k: full_norms[k] for k in norms} == norms  # bit-identical, not approximately
    assert frozen.checkpoints and rep.checkpoints
    after, full = states(frozen, 0), states(rep, 0)
    torch.manual_seed(job.seed)
    init = build_model(source="llama", n_stages=2, seq_len=job.seq_len, config=CONFIG["llama"])
    for r in range(2):
        names = [n for n, _ in init.stages[r].named_parameters()]
        with_state = {names[i] for i in after[r]["optimizer"]["state"]}
        for n, p in init.stages[r].named_parameters():
            got = after[r]["model"][r][n]
            if n.startswith("model.layers.0."):
                assert torch.equal(got, p.detach()) and n not in with_state, n
            else:
                assert torch.equal(got, full[r]["model"][r][n]) and n in with_state, n
