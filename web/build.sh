#!/usr/bin/env bash
# Builds the browser demo into web/dist/ (serve it with any static server).
#
#   web/build.sh            # from a fresh Debian 12 machine: installs what is missing, builds
#
# What it needs, installed when missing (root or sudo for apt):
# - Debian's rustc-web 1.96 + rust-web-src + cargo-web (bookworm-security): rustup cannot add
#   the wasm32 target here, so std is built from source (-Z build-std);
# - lld-22 (the wasm linker);
# - wasm-bindgen-cli at the version in web/Cargo.lock (cargo install, ~2-3 min).
# Output: web/dist/{index.html, app.js, style.css, pkg/, model/} where model/ is the built-in
# model (models/sparsa-bard-12m), loaded by the page by default.
set -euo pipefail
cd "$(dirname "$0")"
WEB="$PWD"
ROOT="$(cd .. && pwd)"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "web/build.sh: need root to run: $*" >&2; exit 1; fi
}

# Debian's rustc for the browser build (rustup's toolchain, if any, stays for native builds).
RUSTC_WEB=/usr/bin/rustc
CARGO_WEB=/usr/bin/cargo
need_apt=()
if ! [ -x "$RUSTC_WEB" ] || ! "$RUSTC_WEB" --version | grep -Eq '^rustc 1\.(9[0-9]|[1-9][0-9]{2})'; then
    need_apt+=(rustc-web cargo-web rust-web-src)
fi
[ -x "$CARGO_WEB" ] || need_apt+=(cargo-web)
[ -d /usr/lib/rustlib/src/rust/library ] || need_apt+=(rust-web-src)
command -v ld.lld-22 >/dev/null || [ -x /usr/lib/llvm-22/bin/ld.lld ] || need_apt+=(lld-22)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "web/build.sh: installing ${need_apt[*]} (apt)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! "$RUSTC_WEB" --version | grep -Eq '^rustc 1\.(9[0-9]|[1-9][0-9]{2})'; then
    echo "web/build.sh: $RUSTC_WEB is $("$RUSTC_WEB" --version); need rustc-web >= 1.90 from bookworm-security (wgpu 30 needs >= 1.87)" >&2
    exit 1
fi

# Debian's cargo builds with Debian's rustc only: not through the clippy-driver that dev.sh's
# native build runs as the workspace's rustc (rustup's, another compiler).
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS

# wasm-bindgen-cli must match the wasm-bindgen crate exactly.
WB_VERSION="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)"
if [ -x "$HOME/.cargo/bin/wasm-bindgen" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$WB_VERSION" ]; then
    echo "web/build.sh: installing wasm-bindgen-cli $WB_VERSION (cargo install, a few minutes)" >&2
    # --force: cargo skips a package its records call installed even when the binary is gone.
    env RUSTC="$RUSTC_WEB" "$CARGO_WEB" install --quiet --force --version "$WB_VERSION" wasm-bindgen-cli  # not --locked: TOOLCHAIN.md
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The wasm build: Debian's cargo and rustc (mixing them with rustup's fails with E0514).
export CARGO_TARGET_DIR="${SPARSA_WEB_TARGET:-$WEB/target}"
echo "web/build.sh: building sparsa-web for wasm32 (release)" >&2
env RUSTC="$RUSTC_WEB" RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 "$CARGO_WEB" build --release --quiet \
    --target wasm32-unknown-unknown -Z build-std=std,panic_abort
WASM="$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/sparsa_web.wasm"

DIST="$WEB/dist"
rm -rf "$DIST"
mkdir -p "$DIST"
wasm-bindgen --target web --no-typescript --out-dir "$DIST/pkg" "$WASM"
cp www/index.html www/app.js www/style.css "$DIST/"
mkdir -p "$DIST/model"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json model.safetensors; do
    cp "$ROOT/models/sparsa-bard-12m/$f" "$DIST/model/"
done
echo "web/build.sh: built $DIST ($(du -sh "$DIST/pkg/sparsa_web_bg.wasm" | cut -f1) wasm); serve it, e.g. python3 -m http.server -d $DIST -b 127.0.0.1 8000" >&2
