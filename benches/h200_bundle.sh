#!/bin/bash
# Builds what the H200 scripts run (benches/h200_setup.sh unpacks it): the release binary,
# the lib, golden and batch test binaries (as libtest, golden, batchtest), examples
# gemv_shapes, gemm_shapes and cpu_experts, stripped and packed into .h200/bundle.tar.xz with one
# dictionary across them (under the 64 MiB a device call carries); .h200/BUILT_FROM names the
# commit. OLD="path/to/sparsa-OLDNAME ..." adds each file named (under its own name: e.g. the
# builds of another commit to alternate against). The Vulkan
# loader debs (.gl/) come from the device README's recipe. About 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}
cargo build --release 2>&1 | tail -1
cargo build --release --example cpu_experts --example gemv_shapes --example gemm_shapes 2>&1 | tail -1
bin() { cargo test --release "$@" --no-run 2>&1 | grep -o 'target/release/deps/[a-z_]*-[0-9a-f]*' | head -1; }
L=$(bin --lib); G=$(bin --test golden); B=$(bin --test batch)
T=$(mktemp -d)
cp target/release/sparsa "$T/sparsa"
cp "$L" "$T/libtest"; cp "$G" "$T/golden"; cp "$B" "$T/batchtest"
cp target/release/examples/gemv_shapes target/release/examples/cpu_experts target/release/examples/gemm_shapes "$T/"
for f in ${OLD:-}; do cp "$f" "$T/$(basename "$f")"; done
strip "$T"/*
mkdir -p .h200
tar -C "$T" -cf - . | xz --lzma2=preset=6,dict=256MiB -T2 > .h200/bundle.tar.xz
git rev-parse --short HEAD > .h200/BUILT_FROM
rm -rf "$T"
ls -la .h200
