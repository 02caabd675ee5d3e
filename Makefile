# Short commands over CMake + Ninja. Each target installs missing Debian packages
# first (scripts/deps.sh), so a fresh machine needs nothing but this repository.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all deps configure demo test bench clean fuzz

all: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash scripts/deps.sh

configure: deps
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

demo: all
	bash scripts/demo.sh $(BUILD)

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: all
	bash scripts/bench.sh $(BUILD)

# libFuzzer over the eBPF loader, verifier and interpreter, for FUZZ_SECONDS (60).
fuzz: deps
	bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD)
