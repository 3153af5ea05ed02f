# The two fresh-machine commands: `make dev` runs the task flow on embedded defaults, `make test` runs
# every check CI runs. Both check their own prerequisites and say what is missing.
SHELL := /bin/bash
CARGO ?= cargo
ADDR ?= 127.0.0.1:3000
DATA_DIR ?= .lanes

.PHONY: dev test toolchain test-deps fmt lint build

toolchain:
	@command -v $(CARGO) >/dev/null || { echo "make: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt || { echo "make: rustfmt missing and could not be installed" >&2; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy || { echo "make: clippy missing and could not be installed" >&2; exit 1; }

dev: toolchain
	$(CARGO) run -p lanes-cli --bin lanes -- dev --addr $(ADDR) --data-dir $(DATA_DIR)

fmt: toolchain
	$(CARGO) fmt --all -- --check

lint: toolchain
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# redis-server (apt) and a venv with moto[server], cargo-lambda and cfn-lint, installed if missing.
test-deps:
	bash scripts/test-deps.sh

# The end-to-end tests start the real `lanes` binary, so build every binary first.
build: toolchain
	$(CARGO) build --workspace --locked

test: fmt lint build test-deps
	$(CARGO) test --workspace --all-targets --locked
