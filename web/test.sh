#!/usr/bin/env bash
# The browser demo's end-to-end test: the page in headless Chromium (WebGPU on SwiftShader)
# generates the same greedy tokens as the native binary on lavapipe.
#
#   web/test.sh      # builds (web/build.sh), installs chromium + playwright-core if missing
#
# Steps: build the page (web/dist) and the native binary; run `sparsa generate --print-ids`
# for the fixed prompt on lavapipe; serve web/dist on 127.0.0.1; drive the page with
# playwright-core (web/test/e2e.mjs): wait for the built-in model, choose "Complete", type the
# prompt, set greedy / 32 tokens, click Generate, read the token ids from the page and compare;
# screenshot to docs/web-demo.png (SPARSA_SCREENSHOT to change). Then check the message a
# Chromium without WebGPU shows.
set -euo pipefail
cd "$(dirname "$0")"
WEB="$PWD"
ROOT="$(cd .. && pwd)"
PROMPT="${SPARSA_PROMPT:-ROMEO: But soft, what light through yonder window breaks?}"
MAX_TOKENS="${SPARSA_MAX_TOKENS:-32}"
SHOT="${SPARSA_SCREENSHOT:-$ROOT/docs/web-demo.png}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "web/test.sh: need root to run: $*" >&2; exit 1; fi
}
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/sparsa-xdg-runtime"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
fi

# 1. The page.
# (dev.sh builds it beside the native tests and says so with SPARSA_WEB_BUILT=1.)
if [ "${SPARSA_WEB_BUILT:-0}" != 1 ]; then "$WEB/build.sh"; fi

# 2. The native tokens, on lavapipe (or whatever Vulkan adapter comes first).
if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi
(cd "$ROOT" && cargo build --quiet --bin sparsa)
SPARSA="${CARGO_TARGET_DIR:-$ROOT/target}/debug/sparsa"
NATIVE_IDS="$("$SPARSA" generate --prompt "$PROMPT" --max-tokens "$MAX_TOKENS" --temperature 0 --print-ids 2>/dev/null | tail -n 1)"
echo "web/test.sh: native ($("$SPARSA" devices 2>/dev/null | head -n 1 | cut -c1-60)...): $NATIVE_IDS" >&2
# The smallest caches (fp8/i8) on a prompt longer than the model's top-64, so the indexer
# scores int8 keys (prefill is faster than decode in the browser: few tokens generated).
COMPACT_PROMPT="$PROMPT $PROMPT $PROMPT $PROMPT"
COMPACT_TOKENS=8
NATIVE_COMPACT="$("$SPARSA" generate --prompt "$COMPACT_PROMPT" --max-tokens "$COMPACT_TOKENS" --temperature 0 --cache-type fp8/i8 --print-ids 2>/dev/null | tail -n 1)"
echo "web/test.sh: native, fp8/i8 caches: $NATIVE_COMPACT" >&2

# 3. Chromium and playwright-core.
if ! [ -x /usr/bin/chromium ]; then
    echo "web/test.sh: installing chromium (apt)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! command -v node >/dev/null; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if ! [ -d "$WEB/node_modules/playwright-core" ]; then
    (cd "$WEB" && npm ci --silent --no-audit --no-fund)
fi

# 4. Serve web/dist on 127.0.0.1 (a free port) and drive the page.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server --bind 127.0.0.1 --directory "$WEB/dist" "$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/')" 2>/dev/null; then break; fi
    sleep 0.1
done
mkdir -p "$(dirname "$SHOT")"
SPARSA_URL="http://127.0.0.1:$PORT/" SPARSA_PROMPT="$PROMPT" SPARSA_EXPECTED="$NATIVE_IDS" \
    SPARSA_EXPECTED_COMPACT="$NATIVE_COMPACT" SPARSA_COMPACT_TOKENS="$COMPACT_TOKENS" \
    SPARSA_COMPACT_PROMPT="$COMPACT_PROMPT" \
    SPARSA_MAX_TOKENS="$MAX_TOKENS" SPARSA_SCREENSHOT="$SHOT" \
    node "$WEB/test/e2e.mjs"
