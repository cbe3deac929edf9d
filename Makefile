# freezeopt — every target installs what it needs into a local venv first.
#   make demo    synth → solve → simulate → Gantt on the built-in example
#   make test    the test suite
#   make bench   solver benchmarks → benchmarks/solver.md
#   make lint    ruff + mypy
PYTHON ?= python3
VENV ?= .venv
# CPU wheel by default; GPU users: make install TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--index-url …"
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo bench lint clean

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
	$(BIN)/freezeopt synth --schedule 1F1B --ranks 4 --microbatches 8 --groups 4 --seed 0 -o profiles/synth-1f1b-4x8.json
	$(BIN)/freezeopt solve profiles/synth-1f1b-4x8.json --budget 0.1 -o schedules/synth-1f1b-4x8.yaml
	$(BIN)/freezeopt validate schedules/synth-1f1b-4x8.yaml --profile profiles/synth-1f1b-4x8.json
	$(BIN)/freezeopt simulate schedules/synth-1f1b-4x8.yaml --profile profiles/synth-1f1b-4x8.json --gantt out/synth-1f1b-4x8.png

bench: install
	$(BIN)/python benchmarks/bench_solver.py --out benchmarks/solver.md

lint: install
	$(BIN)/ruff check freezeopt tests benchmarks
	$(BIN)/ruff format --check freezeopt tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
