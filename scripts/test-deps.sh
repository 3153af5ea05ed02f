#!/usr/bin/env bash
# Installs what the integration and end-to-end tests need, idempotently, and says what it could not:
# redis-server (Debian package), a project venv (.venv) with moto[server], cargo-lambda (+ ziglang, its
# cross linker), cfn-lint, aws-sam-cli and openapi-spec-validator, schemathesis in a venv beside it, and
# Rust's aarch64 Linux target for the arm64 Lambda builds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LANES_VENV:-$PWD/.venv}"

# openssl (the CLI) makes the test CA of the TLS Redis test.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  echo "test-deps: installing redis-server and openssl from the system package manager"
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server openssl >/dev/null \
      || { echo "test-deps: could not install redis-server and openssl with apt-get; install them and re-run" >&2; exit 1; }
  else
    echo "test-deps: redis-server or openssl is missing and there is no apt-get; install Redis 7 and openssl and re-run" >&2; exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "test-deps: creating $VENV"
  python3 -m venv "$VENV" || { echo "test-deps: python3 -m venv failed; install python3-venv" >&2; exit 1; }
fi
# aws-sam-cli 1.170 or later: its rust-cargolambda build method is no longer a beta feature.
if ! "$VENV/bin/python" -c 'import moto, cfnlint, samcli, samtranslator, ziglang, openapi_spec_validator; assert tuple(int(p) for p in samcli.__version__.split(".")[:2]) >= (1, 170)' >/dev/null 2>&1 || [ ! -x "$VENV/bin/cargo-lambda" ]; then
  echo "test-deps: installing moto[server], cargo-lambda, ziglang, cfn-lint, aws-sam-cli and openapi-spec-validator into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check 'moto[server]>=5.2,<6' 'cargo-lambda>=1.9,<2' \
    'ziglang>=0.13,<0.15' 'cfn-lint>=1,<2' 'aws-sam-cli>=1.170,<2' 'openapi-spec-validator>=0.7,<1' \
    || { echo "test-deps: pip install failed (is the package index reachable?)" >&2; exit 1; }
fi

# Schemathesis (the API contract test) in a venv of its own: its pins (hypothesis, jsonschema) must
# not move moto's or aws-sam-cli's.
ST_VENV="${VENV}-schemathesis"
if [ ! -x "$ST_VENV/bin/st" ]; then
  echo "test-deps: installing schemathesis into $ST_VENV"
  { [ -x "$ST_VENV/bin/python" ] || python3 -m venv "$ST_VENV"; } \
    && "$ST_VENV/bin/pip" install -q --disable-pip-version-check 'schemathesis>=4.3,<5' \
    || { echo "test-deps: could not install schemathesis into $ST_VENV (is the package index reachable?)" >&2; exit 1; }
fi

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    echo "test-deps: adding Rust's aarch64-unknown-linux-gnu target (arm64 Lambda builds)"
    rustup target add aarch64-unknown-linux-gnu \
      || { echo "test-deps: rustup target add aarch64-unknown-linux-gnu failed" >&2; exit 1; }
  fi
else
  echo "test-deps: rustup not found; install the aarch64-unknown-linux-gnu target for the arm64 builds" >&2; exit 1
fi
# cargo-lambda is a cargo plugin: it answers `cargo-lambda lambda --version`, not `--version`.
echo "test-deps: redis-server $(redis-server --version | awk '{print $3}'), moto $("$VENV/bin/python" -c 'import moto; print(moto.__version__)'), $("$VENV/bin/cargo-lambda" lambda --version 2>/dev/null | head -n 1 || true), $("$ST_VENV/bin/st" --version 2>/dev/null | head -n 1 || true)"
