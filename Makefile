# transformer-course: one command to open the course, one to test everything.
#   make lab     create .venv if needed, install, open JupyterLab on chapters/
#   make test    same set-up, then export drift check, ruff, the unit tests and strict nbval of every chapter
#   make test-system      the tests that start processes of their own, the wheel's among them (CI runs it)
#   make test-student     every chapter's student edition under strict nbval (CI runs it on the newest torch)
#   make test-wheel       the wheel built, installed in a new venv and every command run
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
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 900
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

.PHONY: help install install-dev lab test test-system torch-venv torch-venv-floor torch-venv-newest clean-torch-venvs test-student test-wheel test-torch test-torch-floor test-torch-newest test-other-cpu test-gpu test-fast export course check lint student test-browser bench clean

help:
	@echo "make lab           open the course in JupyterLab (JUPYTER_ARGS='--no-browser --port 8899')"
	@echo "make test          export drift check, ruff, the unit tests and strict nbval over every chapter"
	@echo "make test-system   the tests that start processes (torchrun, grader sandbox, make lab, the wheel...)"
	@echo "make test-student  every chapter's student edition under strict nbval (each check 'not done')"
	@echo "make test-wheel    build the wheel, install it in a new venv, run every command"
	@echo "make test-other-cpu strict nbval as if on another CPU (instruction set, threads, bf16 probe)"
	@echo "make test-torch TORCH=2.7.0  torch-dependent unit tests and strict nbval on another PyTorch release"
	@echo "                   (a venv cached in ~/.cache/transformer-course/venvs; PYTHON=python3.13 for another Python)"
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
# Units and notebooks share one session (no idle tail between them); a notebook's cells go to one worker
# together, in order (--dist loadfile: a test file goes to one worker whole), and the longest start first.
# Every run writes what each item took to build/durations/$(TC_DURATIONS_RUN).json (conftest.py).
# The device is pinned to the CPU: stored outputs are the CPU's, with or without a GPU in the machine.
JOBS ?= 2
TEST_ENV := OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMER_COURSE_DEVICE=cpu
PYTEST_OPTS := -q -p no:cacheprovider -n $(JOBS) --dist loadfile

# the README's test command: drift check, ruff, the unit tests and strict nbval of every chapter. The
# `system` tier (tests that start processes of their own: torchrun, the sandboxed grader, make lab, killed
# runs, model builders, the wheel) is `make test-system`, which CI runs after it (docs/testing.md).
test: $(STAMP)
	$(BIN)/python tools/nb.py check
	$(BIN)/ruff check transformer_course tests benchmarks tools conftest.py
	TC_DURATIONS_RUN=test $(TEST_ENV) $(BIN)/pytest tests $(CHAPTERS) $(NBVAL) $(PYTEST_OPTS) -m "not system"

# The system tier: first the torch_free tests with `import torch` refused in the test process (the proof
# that their results cannot depend on the PyTorch release: the floor and newest runs leave them out), then
# the rest; the wheel test (`make test-wheel` alone) is one of them.
test-system: $(STAMP)
	TC_DURATIONS_RUN=system-torch-free $(TEST_ENV) $(BIN)/pytest tests --torch-free $(PYTEST_OPTS) -m "torch_free"
	TC_DURATIONS_RUN=system $(TEST_ENV) $(BIN)/pytest tests $(PYTEST_OPTS) -m "system and not torch_free"

# Every chapter's student edition (solutions stubbed) under strict nbval, against the answer key's stored
# outputs with each verdict turned into "not done" (tools/student_nbval.py): the edition runs top to
# bottom, no stub passes a check, and the rest of each chapter shows what the key shows.
STUDENT_NBVAL := build/student-nbval
test-student: $(STAMP)
	$(BIN)/python tools/student_nbval.py $(STUDENT_NBVAL) > /dev/null
	TC_DURATIONS_RUN=student $(TEST_ENV) $(BIN)/pytest $(NBVAL) $(PYTEST_OPTS) $(STUDENT_NBVAL)/chapters/*.ipynb

# The course as `pip install` gives it: a wheel built from this tree, installed into a new venv beside
# torch alone, runs every command (tests/test_wheel.py; also part of make test-system).
test-wheel: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests/test_wheel.py -q -p no:cacheprovider

# The same stored outputs, checked in a second CPU configuration (tools/other_cpu.py says which).
test-other-cpu: $(STAMP)
	TC_DURATIONS_RUN=other-cpu $(BIN)/python tools/other_cpu.py $(NBVAL) $(PYTEST_OPTS) $(CHAPTERS)

# The GPU tier: tests/test_gpu.py's `cuda` tests (skipped by `make test`, which pins the CPU), with the device
# left to PyTorch; every outcome, with the GPU named, goes to benchmarks/results/gpu_tests.json. Stops at
# once, saying so, where PyTorch sees no CUDA GPU. On a machine without .venv: make test-gpu BIN=<dir of python> STAMP=
GPU_JUNIT := build/gpu_tests.xml
test-gpu: $(STAMP)
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu needs a CUDA GPU; PyTorch ' + torch.__version__ + ' sees none here (make test runs everything else)')"
	@mkdir -p build
	-TRANSFORMER_COURSE_DEVICE= OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest tests/test_gpu.py -m cuda -q -p no:cacheprovider -o junit_family=xunit1 --junitxml $(GPU_JUNIT)
	$(BIN)/python tools/gpu_test_report.py $(GPU_JUNIT) benchmarks/results/gpu_tests.json

# Another PyTorch release, in a venv of its own kept between runs OUTSIDE the clone ($(TORCH_VENVS)),
# named after the release, the Python and a hash of pyproject.toml's dependencies (changed dependencies
# build a new one; `make clean-torch-venvs` removes them all). Each run re-links the cached venv to this clone
# (pip --no-deps -e .), then runs the unit tests whose results can depend on torch (not torch_free; not the
# wheel's packaging test, which tests pip and the entry points, run once by make test-system) and
# strict nbval of NBVAL_NOTEBOOKS (default every chapter), through NBVAL_RUNNER (default plain pytest).
# CI: the floor runs the chapters as if on another CPU (tools/other_cpu.py); the newest runs the student
# edition (tools/student_nbval.py). With PYTHON=python3.13 (say) the venv is for that Python.
TORCH ?= $(TORCH_FLOOR)
TORCH_VENVS ?= $(HOME)/.cache/transformer-course/venvs
PY_TAG := $(shell $(PYTHON) -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null)
# what decides a venv's content in pyproject.toml: the build system, the Python range and the dependencies
# (not the version: a release alone does not rebuild the venvs; the clone is re-linked every run anyway)
PYPROJECT_HASH := $(shell $(PYTHON) -c 'import hashlib, json, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); q = p["project"]; print(hashlib.sha256(json.dumps([p.get("build-system"), q.get("requires-python"), q.get("dependencies"), q.get("optional-dependencies")], sort_keys=True).encode()).hexdigest()[:12])' 2>/dev/null)
# the extras a cached venv gets; the newest adds `eval` (lm-evaluation-harness: chapter 13's agreement test runs there)
VENV_EXTRAS ?= lab,dev
comma := ,
TORCH_VENV := $(TORCH_VENVS)/torch-$(TORCH)-$(PY_TAG)-$(subst $(comma),+,$(VENV_EXTRAS))-$(PYPROJECT_HASH)
NBVAL_NOTEBOOKS ?= $(CHAPTERS)
NBVAL_RUNNER ?= -m pytest
NBVAL_PREPARE ?=

# the cached venv, built whole or not at all (.complete is written last; a half-built one is rebuilt)
torch-venv:
	@if [ -f "$(TORCH_VENV)/.complete" ]; then echo "torch $(TORCH): cached venv $(TORCH_VENV)"; else \
	  echo "torch $(TORCH): building $(TORCH_VENV) (kept for later runs)" && rm -rf "$(TORCH_VENV)" && \
	  $(PYTHON) -m venv "$(TORCH_VENV)" && \
	  "$(TORCH_VENV)/bin/python" -m pip install --quiet --upgrade pip packaging && \
	  "$(TORCH_VENV)/bin/python" tools/install_torch.py --exact --spec torch==$(TORCH) && \
	  PYTHONWARNINGS="ignore:Editable installation" "$(TORCH_VENV)/bin/python" -m pip install --quiet -e ".[$(VENV_EXTRAS)]" && \
	  touch "$(TORCH_VENV)/.complete"; fi

torch-venv-floor:
	@$(MAKE) --no-print-directory torch-venv TORCH=$(TORCH_FLOOR)

torch-venv-newest:
	@$(MAKE) --no-print-directory torch-venv TORCH=$(TORCH_NEWEST) VENV_EXTRAS=lab,dev,eval

test-torch: torch-venv
	PYTHONWARNINGS="ignore:Editable installation" "$(TORCH_VENV)/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
	$(if $(NBVAL_PREPARE),"$(TORCH_VENV)/bin/python" $(NBVAL_PREPARE) > /dev/null)
	"$(TORCH_VENV)/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$(TORCH)', torch.__version__; print('testing on torch', torch.__version__)"
	TC_DURATIONS_RUN=torch-$(TORCH) $(TEST_ENV) "$(TORCH_VENV)/bin/pytest" tests $(PYTEST_OPTS) -m "not torch_free" \
	  --ignore=tests/test_wheel.py
	TC_DURATIONS_RUN=torch-$(TORCH)-nbval $(TEST_ENV) "$(TORCH_VENV)/bin/python" $(NBVAL_RUNNER) $(NBVAL) $(PYTEST_OPTS) $(NBVAL_NOTEBOOKS)

test-torch-floor:
	$(MAKE) --no-print-directory test-torch TORCH=$(TORCH_FLOOR) NBVAL_RUNNER=tools/other_cpu.py

test-torch-newest:
	$(MAKE) --no-print-directory test-torch TORCH=$(TORCH_NEWEST) VENV_EXTRAS=lab,dev,eval \
	  NBVAL_PREPARE="tools/student_nbval.py $(STUDENT_NBVAL)" \
	  NBVAL_NOTEBOOKS="$(STUDENT_NBVAL)/chapters/*.ipynb"

clean-torch-venvs:
	rm -rf "$(TORCH_VENVS)"

test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/pytest tests $(PYTEST_OPTS) -m "not system"

test-browser: $(STAMP)
	$(BIN)/python tests/browser/lab_e2e.py --jobs $(JOBS)
	OMP_NUM_THREADS=1 $(BIN)/python tests/browser/chat_page_e2e.py
	$(BIN)/python tests/browser/report_page_e2e.py

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
