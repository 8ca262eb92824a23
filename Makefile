# fedbench: `make run` (venv + install + the default benchmark), `make test` (venv + tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench boards site clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fedbench run --n-jobs auto

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

boards: $(STAMP)
	$(BIN)/fedbench leaderboard build --all --n-jobs auto --threads 1
	$(BIN)/fedbench leaderboard check

# the boards as a static website (open site/index.html; no network needed)
site: $(STAMP)
	$(BIN)/fedbench leaderboard site -o site

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py --out benchmarks/results

clean:
	rm -rf $(VENV) results .pytest_cache
