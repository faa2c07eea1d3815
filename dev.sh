#!/usr/bin/env bash
# sparsa developer entry point. Works on a fresh Debian/Ubuntu machine without a GPU:
#   ./dev.sh run          build sparsa (release) and generate text with the default model
#   ./dev.sh test         run every test: formatting, the native suite built with clippy's lints
#                         (GPU kernels on lavapipe when no other Vulkan driver exists), then the
#                         browser test (web/test.sh)
#   ./dev.sh test FILTER  only the native tests whose names contain FILTER (built with clippy's
#                         lints; no formatting check, no browser)
#   ./dev.sh test-web     only the browser test
set -euo pipefail
cd "$(dirname "$0")"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root to run: $*" >&2; exit 1; fi
}

# A Vulkan driver: lavapipe (Mesa's software rasterizer) when none is installed; `extra`
# packages are installed in the same apt transaction.
ensure_vulkan() {
    local extra="${1:-}" icd=no
    for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
        if compgen -G "$d/*.json" >/dev/null; then icd=yes; fi
    done
    if [ "$icd" = yes ] && ldconfig -p 2>/dev/null | grep libvulkan.so.1 >/dev/null; then
        return
    fi
    echo "dev.sh: no Vulkan driver found; installing lavapipe (mesa-vulkan-drivers)${extra:+ and $extra}" >&2
    as_root apt-get update -qq
    # shellcheck disable=SC2086
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 $extra >/dev/null
}

# What the browser test needs from Debian, in the same apt transaction as lavapipe where
# both are missing (web/build.sh and web/test.sh install whatever is still missing):
# Debian's rustc-web with its library source and cargo (the wasm32 build), lld-22 (its
# linker), Chromium (the headless browser). Node.js and npm come with the machine.
web_packages() {
    local p=()
    /usr/bin/rustc --version 2>/dev/null | grep -Eq '^rustc 1\.(9[0-9]|[1-9][0-9]{2})' || p+=(rustc-web cargo-web)
    [ -x /usr/bin/cargo ] || p+=(cargo-web)
    [ -d /usr/lib/rustlib/src/rust/library ] || p+=(rust-web-src)
    command -v ld.lld-22 >/dev/null || [ -x /usr/lib/llvm-22/bin/ld.lld ] || p+=(lld-22)
    [ -x /usr/bin/chromium ] || p+=(chromium)
    command -v node >/dev/null || p+=(nodejs npm)
    # Not the browser's: the openai client test's virtual environment (ensure_openai).
    python3 -c "import ensurepip, venv" 2>/dev/null || p+=(python3 python3-venv)
    echo "${p[@]}"
}

ensure_web() {
    local p
    p="$(web_packages)"
    if [ -n "$p" ]; then
        echo "dev.sh: installing the browser test's packages: $p" >&2
        as_root apt-get update -qq
        # shellcheck disable=SC2086
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $p >/dev/null
    fi
}

# The browser test: the page in headless Chromium must generate the native binary's tokens
# (the native binary is the one the native suite built). Its screenshot goes to target/.
web_test() {
    ensure_web
    SPARSA_SCREENSHOT="${SPARSA_SCREENSHOT:-$PWD/target/web-demo.png}" web/test.sh
}

# Rust >= 1.87 (wgpu 30). Debian's packaged cargo is older, so use rustup when missing.
ensure_rust() {
    if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
    if command -v cargo >/dev/null; then return; fi
    echo "dev.sh: installing Rust with rustup" >&2
    if ! command -v curl >/dev/null; then as_root apt-get update -qq; as_root apt-get install -y -qq curl ca-certificates >/dev/null; fi
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
}

# The official `openai` Python package in a virtual environment of its own, for
# tests/serve.rs (it drives `sparsa serve` with tests/serve_openai.py). Created once, reused
# after; Debian's python3 needs python3-venv for it (installed here when missing).
OPENAI_VERSION=3.51.0
PYENV_OPENAI="$PWD/target/pyenv-openai"
ensure_openai() {
    local py="$PYENV_OPENAI/bin/python"
    if [ -x "$py" ] && "$py" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
        export SPARSA_OPENAI_PYTHON="$py"; return
    fi
    if ! command -v python3 >/dev/null || ! python3 -c "import ensurepip, venv" 2>/dev/null; then
        echo "dev.sh: installing python3-venv (for the openai client test)" >&2
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    fi
    echo "dev.sh: installing openai==$OPENAI_VERSION into $PYENV_OPENAI" >&2
    rm -rf "$PYENV_OPENAI"
    python3 -m venv "$PYENV_OPENAI"
    "$py" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
    export SPARSA_OPENAI_PYTHON="$py"
}

# Builds every target with clippy's lints (warnings as errors) inside the build itself:
# clippy-driver compiles the workspace's crates as rustc would, linting them on the way (what
# `cargo clippy` does, but with code generated), so the dependencies are compiled once instead
# of also checked for a separate `cargo clippy` (4.4 minutes clean on a 2-core machine; CI
# took ~32). Every cargo command after it must see the same two variables, or cargo builds
# the workspace's crates again.
build_linted() {
    local driver
    driver="$(command -v clippy-driver || rustup which clippy-driver 2>/dev/null || true)"
    if [ -z "$driver" ]; then
        # Lint as before: a check of its own (the build then compiles as plain rustc).
        echo "dev.sh: clippy-driver not found; running cargo clippy on its own" >&2
        cargo clippy --all-targets --quiet -- -D warnings
    else
        export RUSTC_WORKSPACE_WRAPPER="$driver"
        export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    fi
    cargo build --all-targets --quiet
}

# `phase NAME`: prints how long the previous phase took (stderr), so a CI log shows where
# the suite's time goes.
PHASE="" PHASE_START=$SECONDS
phase() {
    if [ -n "$PHASE" ]; then echo "dev.sh: $PHASE took $((SECONDS - PHASE_START)) s" >&2; fi
    PHASE="$1" PHASE_START=$SECONDS
}

# Mesa warns on stderr without a runtime dir (containers, CI).
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/sparsa-xdg-runtime"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

cmd="${1:-help}"
shift || true
case "$cmd" in
run)
    ensure_vulkan; ensure_rust
    cargo build --release --quiet
    if [ $# -eq 0 ]; then
        # The built-in model (models/sparsa-bard-12m, compiled into the binary).
        set -- chat
    fi
    exec target/release/sparsa "$@"
    ;;
test)
    if [ $# -gt 0 ]; then
        # Only the matching native tests.
        ensure_vulkan; ensure_rust
        case "$*" in *serve*) ensure_openai ;; esac
        # Linted as the whole suite builds, so that both share the build.
        build_linted
        exec cargo test -- --test-threads="${SPARSA_TEST_THREADS:-2}" "$@"
    fi
    # The whole suite: every apt package it needs in one transaction, the lints (formatting
    # and clippy, warnings as errors), the native tests, then the browser test.
    phase "installing packages"
    ensure_vulkan "$(web_packages)"; ensure_rust
    if command -v rustup >/dev/null; then rustup component add rustfmt clippy >/dev/null 2>&1 || true; fi
    phase "formatting"
    cargo fmt --all --check
    cargo fmt --check --manifest-path web/Cargo.toml
    phase "installing the openai client"
    ensure_openai
    phase "building the tests, with clippy's lints"
    build_linted
    # The native tests keep about 1.3 of 2 cores busy (lavapipe's shader compiles and the
    # tests' host work come one at a time), so the browser test's page builds beside them:
    # wasm-bindgen-cli and the wasm32 build, 3 and 6 minutes on 2 cores of their own.
    phase "the native tests, the browser page built beside them"
    mkdir -p target
    web/build.sh > target/web-build.log 2>&1 &
    web_build=$!
    trap 'kill $web_build 2>/dev/null || true' EXIT
    cargo test -- --test-threads="${SPARSA_TEST_THREADS:-2}"
    phase "the browser page's build (what was left of it)"
    if ! wait $web_build; then
        cat target/web-build.log >&2; echo "dev.sh: web/build.sh failed" >&2; exit 1
    fi
    trap - EXIT
    phase "the browser test"
    SPARSA_WEB_BUILT=1 web_test
    phase ""
    ;;
test-web)
    ensure_vulkan "$(web_packages)"; ensure_rust
    web_test
    ;;
*)
    echo "usage: ./dev.sh run [sparsa arguments] | ./dev.sh test [test filter] | ./dev.sh test-web" >&2
    exit 2
    ;;
esac
