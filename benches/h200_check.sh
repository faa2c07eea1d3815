#!/bin/bash
# Correctness on a real driver with tensor cores: the lib tests of the kernels and the
# transformers goldens, the checks CI's lavapipe cannot make for the tensor-core GEMM tile
# (lavapipe has no cooperative matrices). Run after any change to shaders/matmul_coop.wgsl or
# its callers: until 2026-12-04 the goldens had not been run on tensor cores, and four of them
# had been missing there since the GEMMs moved onto them (BENCHMARKS.md, "Prefill on tensor
# cores: K-steps of 64").
#
# Build here, carry .h200/ and .gl/ (the Vulkan loader debs, see the device README):
#   cargo test --release --lib --no-run          # -> target/release/deps/sparsa-HASH
#   cargo test --release --test golden --no-run  # -> target/release/deps/golden-HASH
#   strip and `xz -6` them into .h200/libtest.xz and .h200/golden.xz (17 + 2 MB), or into
#   .h200/bundle.tar.xz with the sparsa binary (see h200_setup.sh)
# then on the GPU machine, from the repository root: bash benches/h200_check.sh
# Prints one line per suite; the full outputs go to $OUT.
set -u
. benches/h200_setup.sh
# A shader over the driver's limits can hang it: every step has a timeout.
timeout 300 /tmp/libtest kernels:: bench:: gpu:: --test-threads=4 > $OUT/libtests.txt 2>&1
echo "lib tests (rc $?): $(grep 'test result' $OUT/libtests.txt)"
# The two quantize tests run the sparsa binary of the build machine's target directory.
timeout 300 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -E "max \|Δlogit\||tolerance|argmax|greedy" $OUT/goldens.txt | cut -c1-200
