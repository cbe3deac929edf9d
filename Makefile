# freezeopt — every target installs what it needs into a local venv first.
#   make demo    profile the built-in job for real → solve → train with the schedule → Gantt (files in out/)
#   make test    the test suite
#   make bench   solver benchmarks → benchmarks/solver-latest.md; policies compared → benchmarks/RESULTS.md;
#                online re-planning after a stage slows down → benchmarks/replan.md; re-plans at
#                scale → benchmarks/replan_scale.md; training beside a re-plan → benchmarks/overlap.md
#   make reliability  fuzzing (>10,000 cases) and fault injection → benchmarks/reliability.md
#   make lint    ruff + mypy
PYTHON ?= python3
VENV ?= .venv
# CPU wheel by default; GPU users: make install TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--index-url …"
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo bench reliability lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_EXTRA) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]" "$(TORCH_SPEC)"
	$(BIN)/python -c "import pulp, sys; s = pulp.listSolvers(onlyAvailable=True); print('solvers:', s); sys.exit(0 if 'PULP_CBC_CMD' in s else 1)"
	touch $(STAMP)

test: install
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

bench: install
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
