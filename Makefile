# transformer-course: one command to open the course, one to test everything.
#   make lab     create .venv if needed, install, open JupyterLab on chapters/
#   make test    same set-up, then export drift check, ruff, pytest and strict nbval over every chapter
#   make test-other-cpu   strict nbval again as if on another kind of CPU (other instruction set,
#                         2 threads, the bf16 probe flipped): stored outputs must hold on any CPU
# The notebooks' stored outputs are the offline ones (chapter 08 says the real GPT-2 is unreachable),
# so nbval runs with the Hugging Face hub switched off even where a network exists.
# Variables: PYTHON (interpreter used to create .venv), TORCH_SPEC (what to pip install for PyTorch
# when .venv has none), JUPYTER_ARGS (extra flags for `jupyter lab`, e.g. --no-browser --port 8899).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
JUPYTER_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.transformer-course-installed
CHAPTERS := $(sort $(wildcard chapters/[0-9][0-9]_*.ipynb))
# a cell that runs longer than 15 minutes fails (a kernel that died would otherwise be waited for 33 min)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900 -p no:cacheprovider
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: help install lab test test-other-cpu test-gpu test-fast export course check lint student test-browser bench clean

help:
	@echo "make lab           open the course in JupyterLab (JUPYTER_ARGS='--no-browser --port 8899')"
	@echo "make test          export drift check, ruff, pytest, strict nbval over every chapter"
	@echo "make test-other-cpu strict nbval as if on another CPU (instruction set, threads, bf16 probe)"
	@echo "make test-gpu      the GPU tier (tests/test_gpu.py) on a CUDA GPU; results in benchmarks/results/gpu_tests.json"
	@echo "make test-browser  run every chapter in headless Chromium through JupyterLab"
	@echo "make student       write the student edition to student/"
	@echo "make export        write the notebooks' exported cells into transformer_course/"
	@echo "make course        re-execute every chapter in place (authors)"
	@echo "make bench         run the benchmarks and rewrite benchmarks/results/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# PyTorch first and explicitly: a bare `torch` requirement on a machine without it can pull a
# multi-GB CUDA build; TORCH_SPEC chooses (see README, Troubleshooting).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=chapters $(ROOT_FLAG) $(JUPYTER_ARGS)

check: $(STAMP)
	$(BIN)/python tools/nb.py check

lint: $(STAMP)
	$(BIN)/ruff check transformer_course tests benchmarks tools conftest.py

# Two workers, one PyTorch thread each: on two cores that beats one worker with two threads, and a
# kernel's numbers do not depend on the machine's core count (the stored outputs come from one thread).
# Notebooks go to workers whole (--dist loadfile): a chapter's cells share one kernel, in order;
# conftest.py starts the longest chapter runs first (student edition and nbval) so both workers end together.
# The device is pinned to the CPU: stored outputs are the CPU's, with or without a GPU in the machine.
JOBS ?= 2
TEST_ENV := OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMER_COURSE_DEVICE=cpu

test: $(STAMP)
	$(BIN)/python tools/nb.py check
	$(BIN)/ruff check transformer_course tests benchmarks tools conftest.py
	$(TEST_ENV) $(BIN)/pytest tests -q -p no:cacheprovider -n $(JOBS) --maxschedchunk 2
	$(TEST_ENV) $(BIN)/pytest $(NBVAL) -q -n $(JOBS) --dist loadfile $(CHAPTERS)

# The same stored outputs, checked in a second CPU configuration (tools/other_cpu.py says which).
test-other-cpu: $(STAMP)
	$(BIN)/python tools/other_cpu.py $(NBVAL) -q -n $(JOBS) --dist loadfile $(CHAPTERS)

# The GPU tier: tests/test_gpu.py's `cuda` tests (skipped by `make test`, which pins the CPU), with the device
# left to PyTorch; every outcome, with the GPU named, goes to benchmarks/results/gpu_tests.json. Stops at
# once, saying so, where PyTorch sees no CUDA GPU. On a machine without .venv: make test-gpu BIN=<dir of python> STAMP=
GPU_JUNIT := build/gpu_tests.xml
test-gpu: $(STAMP)
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA GPU; PyTorch ' + torch.__version__ + ' sees none here (make test runs everything else)')"
	@mkdir -p build
	-TRANSFORMER_COURSE_DEVICE= OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest tests/test_gpu.py -m cuda -q -p no:cacheprovider -o junit_family=xunit1 --junitxml $(GPU_JUNIT)
	$(BIN)/python tools/gpu_test_report.py $(GPU_JUNIT) benchmarks/results/gpu_tests.json

test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests -q -p no:cacheprovider -n $(JOBS) -m "not slow"

test-browser: $(STAMP)
	$(BIN)/python tests/browser/lab_e2e.py --jobs $(JOBS)

export: $(STAMP)
	$(BIN)/python tools/nb.py export

course: $(STAMP)
	$(BIN)/python tools/nb.py build --all

student: $(STAMP)
	$(BIN)/transformer-course student-edition student

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done
	$(BIN)/python benchmarks/summary.py

# student/ may hold learners' work (student/submissions/, edited notebooks): only the edition's own,
# unchanged files go (the manifest student/.student-edition.json lists them), and the command says what stays
clean:
	rm -rf build .pytest_cache .ruff_cache
	@if [ -d student ] && [ -x $(BIN)/transformer-course ]; then $(BIN)/transformer-course student-edition student --remove; \
	elif [ -d student ]; then echo "kept student/: without $(BIN)/transformer-course the edition's files can't be told from learners' work"; fi
