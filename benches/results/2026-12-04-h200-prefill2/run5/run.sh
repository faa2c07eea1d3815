#!/bin/bash
# Issue 20: lo halves staged times 4096 and summed in accumulators of their own (the goldens
# of f32 and FP8 checkpoints missed their tolerance on tensor cores, run4). Goldens, lib
# tests, then gemm_shapes beside the previous tile (713f7a6).
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for n in libtest golden gemm_shapes gemm_shapes_old; do xz -dc .h200/$n.xz > /tmp/$n; chmod +x /tmp/$n; done
echo "== smoke"
timeout 60 /tmp/gemm_shapes q4 5 512 > $OUT/smoke.txt 2>&1 || { echo "rc=$?"; tail -5 $OUT/smoke.txt; exit 1; }
echo "== goldens"
timeout 120 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.txt 2>&1; echo "rc=$?"; grep -E "test result|max \|Δ|tolerance|argmax|greedy" $OUT/goldens.txt | head -30 | cut -c1-200
echo "== lib tests kernels:: bench:: gpu::"
timeout 200 /tmp/libtest kernels:: bench:: gpu:: --test-threads=4 > $OUT/libtests.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" $OUT/libtests.txt | head -8 | cut -c1-250
run() { local l=$1 b=$2; shift 2; echo "== $l"
  env "$@" timeout 100 /tmp/$b q4,bf16,q8 5 512,2048 > /tmp/g.txt 2>&1; echo "rc=$?"
  sed "s/^/$l /" /tmp/g.txt >> $OUT/gemm_shapes.txt
  grep -E "^(q4|bf16|q8): " /tmp/g.txt | grep -v matrix | awk '{printf "%s%s@%s=%s ", $1, $2, $(NF-6), $(NF-1)} END {print ""}'; }
run old gemm_shapes_old A=1
run new gemm_shapes A=1
