#!/usr/bin/env bash
# GPU check of `freezeopt profile`: profile the built-in tiny-gpt job on CUDA (nccl between ranks,
# CUDA events for action, group and optimizer costs) and print the report.
#
# STATUS: UNVERIFIED. Written on a CPU-only machine; the CUDA path (freezeopt/torchpp/pipeline.py's Clock,
# freezeopt/torchpp/launch.py's rank_device and _init_pg, the nccl/one-GPU-per-rank check) has never run. Run this
# whenever a GPU is available and record the report (and any failure) in benchmarks/gpu_check.md.
#
# Needs a CUDA build of torch 2.13 in the venv, e.g.
#   make install TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--index-url https://download.pytorch.org/whl/cu128"
#
# Usage: benchmarks/gpu_check.sh [OUT]      (default out/tiny-gpt-cuda.json)
# With 2+ GPUs: 2 ranks, 1F1B, one GPU each. With 1 GPU: 1 rank running both stages with
# Interleaved1F1B (nccl needs one GPU per rank), which exercises CUDA timing but no transfers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-out/tiny-gpt-cuda.json}"
mkdir -p "$(dirname "$OUT")"
exec "$PY" -c '
import sys
from pathlib import Path

import torch

from freezeopt.profiling.run import format_report, profile_job

if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; install a CUDA build of torch 2.13")
    n = torch.cuda.device_count()
    print(f"gpu_check: torch {torch.__version__}, {n} x {torch.cuda.get_device_name(0)}", file=sys.stderr)
    overrides = {"name": "tiny-gpt-cuda", "device": "cuda"}
    if n == 1:
        overrides.update(ranks=1, schedule="Interleaved1F1B", stages_per_rank=2)
    report = profile_job("tiny-gpt", out=Path(sys.argv[1]), overrides=overrides)
    print(format_report(report))
' "$OUT"
