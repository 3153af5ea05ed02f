# The two fresh-machine commands: `make dev` runs the task flow on embedded defaults, `make test` runs
# every check CI runs. Both check their own prerequisites and say what is missing.
SHELL := /bin/bash
CARGO ?= cargo
ADDR ?= 127.0.0.1:3000
DATA_DIR ?= .lanes

VENV ?= $(or $(LANES_VENV),$(CURDIR)/.venv)

.PHONY: dev test toolchain test-deps fmt lint build stack-check bench

toolchain:
	@command -v $(CARGO) >/dev/null || { echo "make: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt || { echo "make: rustfmt missing and could not be installed" >&2; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy || { echo "make: clippy missing and could not be installed" >&2; exit 1; }

# The same build as `make test` (the whole workspace, so features unify the same way): running one
# after the other compiles nothing again.
dev: build
	"$$($(CARGO) metadata --format-version 1 --no-deps --locked | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/lanes" dev --addr $(ADDR) --data-dir $(DATA_DIR)

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

# The stack as AWS would see it: cfn-lint with no errors or warnings, then the README's deploy path
# up to the upload: `sam validate --lint` and `sam build` (cargo-lambda + zig, arm64 release, with
# samconfig.toml's settings), whose every function must come out as an aarch64 `bootstrap`.
SAM_BUILD_DIR ?= .aws-sam/build
stack-check: test-deps
	$(VENV)/bin/cfn-lint template.yaml
	PATH="$(VENV)/bin:$$PATH" SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 $(VENV)/bin/sam validate --lint
	PATH="$(VENV)/bin:$$PATH" SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 $(VENV)/bin/sam build --build-dir $(SAM_BUILD_DIR)
	python3 scripts/check-sam-build.py $(SAM_BUILD_DIR)

test: fmt lint build test-deps stack-check
	$(CARGO) test --workspace --all-targets --locked

# Benchmarks: each prints JSON into bench/, then bench/REPORT.md with tables and PNG plots (matplotlib
# from the venv). The commands behind each section are in the report.
LANES_BIN = $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/debug/lanes
# Throughput and fairness are measured on the release code (with symbols, for `perf record`), not
# the debug build.
LANES_RELEASE_BIN = $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/profiling/lanes
# A real LiteLLM proxy for the provider bench, in a venv of its own (its pins must not move moto's).
LITELLM_VENV = $(VENV)-litellm
bench: build test-deps
	@$(VENV)/bin/python -c 'import matplotlib' 2>/dev/null || $(VENV)/bin/pip install -q --disable-pip-version-check 'matplotlib>=3.8,<4' \
	  || { echo "make: could not install matplotlib into $(VENV)" >&2; exit 1; }
	@[ -x $(LITELLM_VENV)/bin/litellm ] || { { [ -x $(LITELLM_VENV)/bin/python ] || python3 -m venv $(LITELLM_VENV); } \
	  && $(LITELLM_VENV)/bin/pip install -q --disable-pip-version-check 'litellm[proxy]>=1.108,<2'; } \
	  || { echo "make: could not install the LiteLLM proxy into $(LITELLM_VENV) (is the package index reachable?)" >&2; exit 1; }
	mkdir -p bench
	$(CARGO) build --locked --profile profiling -p lanes-cli -p lanes-ingress -p lanes-worker
	$(LANES_RELEASE_BIN) bench hol --json > bench/hol.json
	LANES_VENV=$(VENV) $(LANES_RELEASE_BIN) bench fairness --json > bench/fairness.json
	LANES_VENV=$(VENV) $(LANES_BIN) bench share --json > bench/share.json
	LANES_VENV=$(VENV) $(LANES_BIN) bench recovery --json > bench/recovery.json
	LANES_VENV=$(VENV) $(LANES_RELEASE_BIN) bench throughput --tasks 20000 --aws-tasks 3000 --json > bench/throughput.json
	$(LANES_RELEASE_BIN) bench soak --json > bench/soak.json
	LANES_VENV=$(VENV) $(LANES_RELEASE_BIN) bench stream --json > bench/stream.json
	LANES_VENV=$(VENV) $(LANES_RELEASE_BIN) bench functions --tasks 3000 --json > bench/functions.json
	LANES_VENV=$(VENV) $(LANES_BIN) bench coldstart --json > bench/coldstart.json
	$(LANES_BIN) bench limiter --json > bench/limiter.json
	$(LANES_BIN) bench provider --litellm $(LITELLM_VENV)/bin/litellm --json > bench/provider.json
	$(LANES_BIN) bench batching --json > bench/batching.json
	$(LANES_BIN) bench cost --commits 1000 --json > bench/cost.json
	$(LANES_BIN) bench duplicates --json > bench/duplicates.json
	$(LANES_BIN) sim --histories 10000 --json > bench/sim.json
	$(VENV)/bin/python scripts/bench-report.py bench
