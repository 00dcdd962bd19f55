# Developer and CI entry points for ppp. CI runs `make test` (see .ci/run).
# GNU make. Pinned versions come from versions.env, shared with the scripts,
# the dev container and the Rust code.

include versions.env

SHELL := /bin/sh
MAKEFLAGS += --no-builtin-rules
.DEFAULT_GOAL := build

CARGO ?= cargo

# `make install PREFIX=/usr/local` installs to $(PREFIX)/bin and the man pages
# to $(PREFIX)/share/man; without PREFIX, cargo's own default (~/.cargo/bin,
# pages in ~/.cargo/share/man) applies. MANDIR and PPP_DATA, given on the
# command line, reach scripts/install.sh through the environment.
PREFIX ?=

# The pinned mitmproxy venv the end-to-end tests run, built by test-deps.
# Exported so that the tests and scripts/install-test-deps.sh agree on it.
PPP_TEST_VENV ?= $(CURDIR)/target/test-venv
PPP_TEST_MITMDUMP ?= $(PPP_TEST_VENV)/bin/mitmdump
export PPP_TEST_VENV PPP_TEST_MITMDUMP

SHELL_SCRIPTS := $(wildcard scripts/*.sh bench/*.sh tests/support/*.sh tests/vm/*.sh fuzz/*.sh assets/*.sh) tests/fake-podman/guest-bin/sudo $(wildcard tests/fake-podman/host-bin/*) tests/vm/podman tests/vm/bin/qemu-system-x86_64 .ci/run

.PHONY: help build install install-man man test-deps test test-vm check check-versions layers lint py-check clippy fmt fmt-check bench fuzz clean

help:
	@echo 'make build       release build (cargo build --release --locked)'
	@echo 'make install     ppp to $$PREFIX/bin (default ~/.cargo/bin), man pages to $$MANDIR (default share/man beside it),'
	@echo '                 the mitmproxy venv to $$PPP_DATA/venv (default ~/.local/share/ppp), then `ppp version`'
	@echo 'make install-man only the man pages, from the ppp already installed'
	@echo 'make man         one man page per command into target/man (ppp.1, ppp-policy-allow.1, ...)'
	@echo 'make test-deps   Debian packages and the mitmproxy $(MITMPROXY_VERSION) venv (root; idempotent)'
	@echo 'make test        test-deps, check-versions, py-check, then the whole test suite (what CI runs)'
	@echo 'make test-vm     the real-VM test alone (also part of make test): podman 5.4 machine, qemu KVM or TCG, from Debian packages (root, /dev/kvm)'
	@echo 'make layers      only tests/layers.rs: no file below the command line names it, sandbox/ never names kit/'
	@echo 'make py-check    the addon (assets/addon, tests/addon): ruff check, ruff format --check, mypy --strict'
	@echo 'make check       fmt-check, clippy -D warnings, layers, lint, py-check, then test'
	@echo 'make bench       criterion benchmarks and bench/cli.sh (hyperfine)'
	@echo 'make fuzz        run each cargo-fuzz target for FUZZ_SECONDS (default 60)'
	@echo 'make fmt         cargo fmt'
	@echo 'make clean       cargo clean (this also removes the default test venv in target/)'

build:
	$(CARGO) build --release --locked

install:
	PREFIX="$(PREFIX)" scripts/install.sh

install-man:
	PREFIX="$(PREFIX)" scripts/install.sh man

# Generated from the clap tree by the hidden `ppp __man DIR`, like --help.
man:
	$(CARGO) run --locked --quiet -- __man target/man

test-deps:
	scripts/install-test-deps.sh

check-versions:
	scripts/check-versions.sh

# scripts/run-tests.sh runs every test target plus doctests and ends with a
# `total: N passed, N failed` line. Benchmarks run once as smoke tests only;
# nothing is timed here.
# The addon's Python tests run inside it too, under pytest: tests/addon.rs
# starts the daemon they need and runs each class.
test: test-deps check-versions py-check
	scripts/run-tests.sh

# The real-VM tests (tests/e2e_vm.rs, tests/e2e_vm_many.rs): a trixie root with podman 5.4, gvproxy
# and qemu, and a Debian guest image, both built once by tests/vm/build-image.sh
# into $$XDG_CACHE_HOME/ppp-test (or $$PPP_VM_CACHE). A missing /dev/kvm fails
# with a hint. Part of `make test` too; this target runs it alone, with the
# images built first. The qemu wrapper picks KVM or TCG (PPP_VM_ACCEL=kvm|tcg
# forces one). See docs/harness.md ("The real VM").
test-vm: test-deps
	PPP_VM_DIR="$$(tests/vm/build-image.sh)" && export PPP_VM_DIR && \
	$(CARGO) test --locked --test e2e_vm -- --nocapture --test-threads=1 && \
	$(CARGO) test --locked --test e2e_vm_many -- --nocapture --test-threads=1

fmt:
	$(CARGO) fmt

fmt-check:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --all-targets --locked -- -D warnings

# Seconds, where `test` (which runs it again) takes half an hour: an import
# against the layers (docs/architecture.md, "Layers") shows before the wait.
layers:
	$(CARGO) test --locked --test layers

lint: test-deps check-versions
	shellcheck $(SHELL_SCRIPTS)

# The addon's Python, with the tools versions.env pins (installed into the
# test venv by test-deps; configured in pyproject.toml). Seconds; part of
# `test`, so CI (.ci/run) runs it.
PY_TOOLS := $(PPP_TEST_VENV)/bin
py-check: test-deps
	$(PY_TOOLS)/ruff check
	$(PY_TOOLS)/ruff format --check
	$(PY_TOOLS)/mypy

check: fmt-check clippy layers lint py-check test

bench:
	$(CARGO) bench --locked
	bench/cli.sh

FUZZ_SECONDS ?= 60
fuzz:
	fuzz/run.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean
