#!/usr/bin/env bash
# GPU check of the torchtitan integration: torchtitan's trainer profiles its llama3 debug model
# (profile mode, pipeline degree 2: two GPUs, nccl, CUDA-event costs), freezeopt solves it, and the
# trainer replays the schedule against the same job without one (benchmarks/bench_torchtitan.py),
# with FSDP2 shard degree 2 too where there are 4 GPUs. Writes benchmarks/torchtitan-gpu.md and .json.
#
# STATUS: UNVERIFIED. Written on a CPU-only machine. torchtitan's pipeline needs a GPU per rank
# (nccl refuses two ranks on one device), so this needs at least 2 GPUs; a one-GPU loan cannot run it.
#
# Needs a CUDA build of torch 2.13 and the torchtitan extra in the venv, e.g.
#   make install-torchtitan TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--index-url https://download.pytorch.org/whl/cu128"
#
# Usage: benchmarks/gpu_check_torchtitan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$n" -lt 2 ]; then
    echo "gpu_check_torchtitan: $n CUDA device(s); torchtitan's pipeline needs 2 (one per rank)" >&2
    exit 1
fi
fsdp=()
if [ "$n" -ge 4 ]; then fsdp=(--fsdp); fi
exec "$PY" benchmarks/bench_torchtitan.py --out benchmarks/torchtitan-gpu.md \
    --work out/bench-torchtitan-gpu --repeats 3 "${fsdp[@]}"
