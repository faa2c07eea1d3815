#!/usr/bin/env bash
# sparsa developer entry point. Works on a fresh Debian/Ubuntu machine without a GPU:
#   ./dev.sh run    build sparsa (release) and generate text with the default model
#   ./dev.sh test   run every test (GPU kernels on lavapipe when no other Vulkan driver exists)
set -euo pipefail
cd "$(dirname "$0")"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root to run: $*" >&2; exit 1; fi
}

# A Vulkan driver: lavapipe (Mesa's software rasterizer) when none is installed.
ensure_vulkan() {
    local icd=no
    for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
        if compgen -G "$d/*.json" >/dev/null; then icd=yes; fi
    done
    if [ "$icd" = yes ] && ldconfig -p 2>/dev/null | grep libvulkan.so.1 >/dev/null; then
        return
    fi
    echo "dev.sh: no Vulkan driver found; installing lavapipe (mesa-vulkan-drivers)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
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
    ensure_vulkan; ensure_rust
    if [ $# -eq 0 ]; then
        # The whole suite starts with the lints: formatting and clippy, warnings as errors.
        if command -v rustup >/dev/null; then rustup component add rustfmt clippy >/dev/null 2>&1 || true; fi
        cargo fmt --all --check
        cargo fmt --check --manifest-path web/Cargo.toml
        cargo clippy --all-targets --quiet -- -D warnings
    fi
    cargo build --tests --quiet
    exec cargo test -- --test-threads="${SPARSA_TEST_THREADS:-2}" "$@"
    ;;
*)
    echo "usage: ./dev.sh run [sparsa arguments] | ./dev.sh test [test filter]" >&2
    exit 2
    ;;
esac
