# Two entry points (see README): `make quickstart` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export MPLBACKEND := Agg

.PHONY: quickstart demo test test-fast lint format bench load results venv clean

venv: $(STAMP)

# Re-install only when the declared or pinned dependencies change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

# The embedded quickstart study (digits, 4 losses, 8 trials); re-running continues/reuses it.
quickstart: $(STAMP)
	$(BIN)/calibtune run studies/quickstart.yaml --quiet

demo: $(STAMP)
	$(BIN)/python -m calibtune.demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The full suite, slow tests included (CI runs exactly this).
test: lint
	$(BIN)/python -m pytest -q --timeout=900 --durations=25

test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow" --timeout=600

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# The 200-trial load study (≈ 15 min on 2 cores); numbers in bench/README.md. CI runs 6 trials.
load: $(STAMP)
	$(BIN)/python bench/bench_load.py --trials 200

# docs/results.md: runs studies/results/{mnist1d,digits}.yaml (storage runs/results) and writes the
# page and docs/img/results/; a finished study is reused. Not part of `make test`.
results: $(STAMP)
	$(BIN)/python bench/results.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
