# transformer-course: one command to open the course, one to test everything.
#   make lab     create .venv if needed, install, open JupyterLab on chapters/
#   make test    same set-up, then export drift check, ruff, pytest and strict nbval over every chapter
#   make test-student     every chapter's student edition run top to bottom by the grader (CI runs it)
#   make test-wheel       the wheel built, installed in a new venv and every command run (CI runs it)
#   make test-other-cpu   strict nbval again as if on another kind of CPU (other instruction set,
#                         2 threads, the bf16 probe flipped): stored outputs must hold on any CPU
# The notebooks' stored outputs are the offline ones (chapter 08 says the real GPT-2 is unreachable),
# so nbval runs with the Hugging Face hub switched off even where a network exists.
# Variables: PYTHON (interpreter used to create .venv), TORCH_SPEC and TORCH_PIP_ARGS (which PyTorch to
# install, and pip options for it, when .venv has no supported one: tools/install_torch.py),
# JUPYTER_ARGS (extra flags for `jupyter lab`, e.g. --no-browser --port 8899).

PYTHON ?= python3
VENV ?= .venv
JUPYTER_ARGS ?=
BIN := $(VENV)/bin
LAB_STAMP := $(VENV)/.transformer-course-lab
STAMP := $(VENV)/.transformer-course-dev
# the PyTorch releases CI tests besides the default one: the floor pyproject.toml admits, and the newest
# release these machines can install (make test-torch TORCH=...)
TORCH_FLOOR := 2.7.0
TORCH_NEWEST := 2.14.1
CHAPTERS := $(sort $(wildcard chapters/[0-9][0-9]_*.ipynb))
# a cell that runs longer than 15 minutes fails (a kernel that died would otherwise be waited for 33 min)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900 -p no:cacheprovider
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: help install install-dev lab test test-student test-wheel test-torch test-torch-floor test-torch-newest test-other-cpu test-gpu test-fast export course check lint student test-browser bench clean

help:
	@echo "make lab           open the course in JupyterLab (JUPYTER_ARGS='--no-browser --port 8899')"
	@echo "make test          export drift check, ruff, pytest, strict nbval over every chapter"
	@echo "make test-student  every chapter's student edition run by the grader (each check 'not done')"
	@echo "make test-wheel    build the wheel, install it in a new venv, run every command"
	@echo "make test-other-cpu strict nbval as if on another CPU (instruction set, threads, bf16 probe)"
	@echo "make test-torch TORCH=2.6.0  unit tests and strict nbval on another PyTorch release (its own venv;"
	@echo "                   PYTHON=python3.13 for another Python too)"
	@echo "make test-gpu      the GPU tier (tests/test_gpu.py) on a CUDA GPU; results in benchmarks/results/gpu_tests.json"
	@echo "make test-browser  run every chapter in headless Chromium through JupyterLab; serve's chat page"
	@echo "make student       write the student edition to student/"
	@echo "make export        write the chapter scripts' exported cells into transformer_course/"
	@echo "make course        re-execute every chapter in place (authors)"
	@echo "make bench         run the benchmarks and rewrite benchmarks/results/"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# PyTorch first: kept when .venv already has a supported one; otherwise installed by tools/install_torch.py
# (the CPU build on Linux without an NVIDIA GPU, where PyPI's default would be the multi-GB CUDA build).
# `make lab` installs what learners need; the test tools come with `make test` (and the other test targets).
$(LAB_STAMP): pyproject.toml | $(BIN)/python
	@echo "[1/2] PyTorch: kept if $(VENV) has a supported one, else installed"
	@$(BIN)/python -m pip install --quiet --upgrade pip packaging
	@$(BIN)/python tools/install_torch.py
	@echo "[2/2] the course and what its chapters use (JupyterLab, widgets, tiktoken, transformers): about a minute"
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e ".[lab]"
	@touch $(LAB_STAMP)
	@echo "installed: $$(du -sh $(VENV) | cut -f1) in $(VENV)"

$(STAMP): $(LAB_STAMP)
	@echo "the test tools (pytest, nbval, ruff, hypothesis, Playwright, export tooling)"
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e ".[lab,dev]"
	@touch $(STAMP)

install: $(LAB_STAMP)

install-dev: $(STAMP)

lab: $(LAB_STAMP)
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
	$(TEST_ENV) $(BIN)/pytest tests -q -p no:cacheprovider -n $(JOBS) --maxschedchunk 2 $(NOT_IN_MAKE_TEST)
	$(TEST_ENV) $(BIN)/pytest $(NBVAL) -q -n $(JOBS) --dist loadfile $(CHAPTERS)

# Two runs of the whole product that `make test` leaves to targets of their own (CI runs both after it):
# the student editions (every chapter executed a second time) and the installed wheel (a build, a new
# venv and every command): together about 6 minutes on two cores, which would take make test past 10.
NOT_IN_MAKE_TEST := -m "not student_edition" --ignore=tests/test_wheel.py

# Every chapter's student edition run top to bottom by the grader (solutions stubbed, every check "not
# done", the chapter still finishing): a second execution of every chapter, so not in `make test`; CI runs it.
test-student: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests -q -p no:cacheprovider -n $(JOBS) -m student_edition

# The course as `pip install` gives it: a wheel built from this tree, installed into a new venv beside
# torch alone, runs every command (tests/test_wheel.py).
test-wheel: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests/test_wheel.py -q -p no:cacheprovider

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

# Unit tests and strict nbval of every chapter on another PyTorch release, in a venv of its own
# (.venv-torch-X.Y.Z): CI runs it for TORCH_FLOOR and TORCH_NEWEST. The stored outputs must hold on each.
# With PYTHON=python3.13 (say) the venv is .venv-torch-X.Y.Z-python3.13: another Python, its own venv.
TORCH ?= $(TORCH_FLOOR)
TORCH_VENV := .venv-torch-$(TORCH)$(if $(filter-out python3,$(PYTHON)),-$(notdir $(PYTHON)))
test-torch:
	$(MAKE) --no-print-directory install-dev VENV=$(TORCH_VENV) TORCH_SPEC=torch==$(TORCH)
	$(TORCH_VENV)/bin/python tools/install_torch.py --exact --spec torch==$(TORCH)
	$(TORCH_VENV)/bin/python -c "import torch; assert torch.__version__.split('+')[0] == '$(TORCH)', torch.__version__; print('testing on torch', torch.__version__)"
	$(TEST_ENV) $(TORCH_VENV)/bin/pytest tests -q -p no:cacheprovider -n $(JOBS) --maxschedchunk 2 $(NOT_IN_MAKE_TEST)
	$(TEST_ENV) $(TORCH_VENV)/bin/pytest $(NBVAL) -q -n $(JOBS) --dist loadfile $(CHAPTERS)

test-torch-floor:
	$(MAKE) --no-print-directory test-torch TORCH=$(TORCH_FLOOR)

test-torch-newest:
	$(MAKE) --no-print-directory test-torch TORCH=$(TORCH_NEWEST)

test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests -q -p no:cacheprovider -n $(JOBS) -m "not slow"

test-browser: $(STAMP)
	$(BIN)/python tests/browser/lab_e2e.py --jobs $(JOBS)
	OMP_NUM_THREADS=1 $(BIN)/python tests/browser/chat_page_e2e.py

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
