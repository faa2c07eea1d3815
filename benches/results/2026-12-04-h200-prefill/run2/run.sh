#!/bin/bash
# Issue 20: the GEMM tile restaged (f16 pairs, two stages, one barrier a K-step): the lib
# tests of the kernels on tensor cores, then examples/gemm_shapes at 128, 512 and 2,048 rows
# (SPARSA_COOP_PROBE=4: x's lo half dropped, for the time only).
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
xz -dc .h200/libtest.xz > /tmp/lt; chmod +x /tmp/lt
xz -dc .h200/gemm_shapes.xz > /tmp/gs; chmod +x /tmp/gs
echo "== lib tests (kernels, bench)"
timeout 300 /tmp/lt kernels:: bench:: --test-threads=4 > $OUT/libtests.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" $OUT/libtests.txt | head -20
for p in 0 4; do
  echo "== probe $p"
  SPARSA_COOP_PROBE=$p timeout 120 /tmp/gs q4,bf16 5 128,512,2048 > $OUT/probe$p.txt 2>&1
  grep -E "q4:|bf16:|rror|peak|TFLOP" $OUT/probe$p.txt | grep -v "matrix" | cut -c1-120
done
