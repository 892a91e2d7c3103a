# perflab: every command a user runs. `make help` lists them.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
STAMP := $(VENV)/.installed
SIZE ?= small
export PYTHONUNBUFFERED := 1

.PHONY: bundle profile help setup data test test-fast lint demo bench bench-augment bench-verify bench-mystery bench-mystery-ids bench-decisions bench-grade gpu-check labs labs-check lab sync calibrate report clean

help:  ## list the commands
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[labs,dev,ray]'
	$(PYTHON) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@

setup: $(STAMP) data  ## make .venv, install perflab editable with its extras at the versions in constraints.txt, build the tiny, small and photo data sets

data: $(STAMP)  ## build the tiny, small and photo synthetic data sets (seeded, verified against the manifest)
	$(BIN)/perflab dataset build --size tiny
	$(BIN)/perflab dataset build --size small
	$(BIN)/perflab dataset build --size photo

test: setup  ## set up, then run the whole test suite
	$(BIN)/pytest -q --durations=25

test-fast: setup  ## unit tests only (skips notebook and pipeline runs)
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)  ## ruff over every Python file of the repo (the package, tests, benchmarks, notebook twins)
	$(BIN)/ruff check .

demo: setup labs  ## grade a demo class on every lab end to end, with reports: make demo [LABS="lab01_measure lab02_feed"] [MODE=tiny]
	$(PYTHON) -m perflab.demo $(if $(LABS),--labs $(LABS)) $(if $(MODE),--mode $(MODE))

profile: setup  ## profile the ResNet-18 baseline on the small data set (throughput, phases, FLOPs, memory, roofline)
	$(BIN)/perflab profile --size small

bench: setup  ## perflab.timing against torch.utils.benchmark on the same function
	$(PYTHON) bench/bench_timing.py

bench-augment: setup  ## the batched augmentation on the device against kornia's per image, per batch of 128 (CPU, and CUDA when present)
	$(PYTHON) bench/bench_augment.py

clean:  ## remove built data and caches (keeps .venv)
	rm -rf datasets/build .pytest_cache

labs: $(STAMP)  ## regenerate the student notebooks in labs/ from solutions/ with nbgrader
	$(PYTHON) -m perflab.labs.build generate

lab: $(STAMP)  ## run one lab top to bottom and time it: make lab LAB=lab01_measure [MODE=laptop]
	$(PYTHON) -m perflab.labs.build run $(LAB) $(if $(MODE),--mode $(MODE))

labs-check: $(STAMP)  ## fail if a jupytext twin or a student copy in labs/ is stale
	$(PYTHON) -m perflab.labs.build check

sync: $(STAMP)  ## rewrite each solutions/ notebook from its jupytext .py twin
	$(PYTHON) -m perflab.labs.build sync

bench-verify: setup  ## accuracy study of the speedup-verification protocol (prints a table)
	$(PYTHON) bench/bench_verify.py

bench-mystery: setup  ## what lab 1's planted bugs cost, and each id's fix re-measured by perflab.verify
	$(PYTHON) bench/bench_mystery.py

bench-mystery-ids: setup  ## lab 1's reference diagnosis graded under 40 ids x2 covering every bug pair and amount, notebook vs grader savings side by side (an hour or more on 2 cores): make bench-mystery-ids [ARGS="--ids 40 --repeats 2"]
	$(PYTHON) bench/bench_mystery_ids.py $(ARGS)

gpu-check: setup  ## the kit on a GPU in one call (9 min): env, CUDA tests, calibration, lazy/reference judges, then profiles: make gpu-check [ARGS="--device cpu --mode tiny"]
	$(PYTHON) bench/gpu_check.py $(ARGS)

bench-decisions: setup  ## what the decision tests simulate, measured here: a loader worker on one core and compiling at 32 px, re-measured by the judges (about 2 min): make bench-decisions [ARGS="--cases workers --repeats 3"]
	$(PYTHON) bench/bench_decisions.py $(ARGS)

bench-grade: setup  ## grading throughput: serial, local pool, Ray
	$(PYTHON) bench/bench_grade.py

report: $(STAMP)  ## render every results/*.json into report.html (figures also as PNG in report_figs/)
	$(BIN)/perflab report results/*.json -o report.html --png-dir report_figs

bundle: $(STAMP)  ## the student distribution dist/perflab-student.zip (labs, package, data recipe; no solutions)
	$(PYTHON) -m perflab.bundle

calibrate: setup  ## measure reference speedups on this machine and write autograder/expectations/
	$(BIN)/perflab calibrate
