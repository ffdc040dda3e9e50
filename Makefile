# Sandcell: the two front-door commands are `make run` and `make test` (see README.md).
#
# Artifacts: the guest kernel and images are built once and cached under
# ~/.cache/sandcell/ by the hash of their inputs; `install` puts them in DATA_DIR, where the
# `sandcell` command looks for them.

DATA_DIR ?= /var/lib/sandcell
CARGO ?= cargo
HOST_TRIPLE := x86_64-unknown-linux-gnu
AGENT_BIN := target/$(HOST_TRIPLE)/release/sandcell-agent
export SANDCELL_DATA_DIR := $(DATA_DIR)

.PHONY: run test test-unit test-microvm test-nested test-gvisor test-images deps build build-release agent \
        kernel images install bench fmt lint clean

## make run: set everything up on a fresh machine, then run a demo command in a sandbox.
run: deps build-release install
	@echo "==> sandcell doctor"
	@target/release/sandcell doctor
	@echo "==> sandcell run -- sh -c 'echo hello from a sandbox; uname -a; id'"
	@target/release/sandcell run --verbose -- sh -c 'echo hello from a sandbox; uname -a; id'

## make test: every test: unit, payloads on /dev/kvm, the gvisor suite, images, the nested-KVM harness.
test: build agent install
	$(CARGO) nextest run --workspace --no-fail-fast
	$(MAKE) test-images
	$(MAKE) test-nested

## make test-microvm: the VMM's payload tests (native /dev/kvm) and the nested-KVM harness.
test-microvm: build agent install
	$(CARGO) nextest run -p sandcell-vmm --no-fail-fast
	$(MAKE) test-nested

test-nested: build agent install
	tests/nested/run.sh

test-images: build install
	tests/images/base.sh

test-gvisor: build agent install
	$(CARGO) nextest run -p sandcell-runtime -p sandcell-cli --no-fail-fast

deps:
	@.ci/install-deps

build:
	$(CARGO) build --workspace --bins

build-release: agent
	$(CARGO) build --release -p sandcell-cli -p sandcell-vmm

## The agent runs in any image, so it is linked statically (glibc, crt-static).
agent:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release --target $(HOST_TRIPLE) -p sandcell-agent

kernel:
	scripts/build-kernel.sh >/dev/null

images: agent
	scripts/build-image.sh minimal --agent $(AGENT_BIN) >/dev/null
	nice scripts/build-image.sh base --agent $(AGENT_BIN) >/dev/null

install: kernel images
	scripts/install-artifacts.sh --data-dir $(DATA_DIR)

bench: build-release install
	bench/run.sh

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
