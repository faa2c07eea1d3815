#!/bin/bash
# Issue 20: the tile with K-steps of 64 and 16-byte x loads. Lib tests (kernels), the
# transformers goldens and gemm_shapes, each with x as f16 hi + lo (SPARSA_COOP_X_F16=0,
# the precise path) and as one f16 value (=1).
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for n in libtest golden gemm_shapes; do xz -dc .h200/$n.xz > /tmp/$n; chmod +x /tmp/$n; done
echo "== smoke: gemm_shapes q4 512 (stop if it hangs)"
timeout 60 /tmp/gemm_shapes q4 5 512 > $OUT/smoke.txt 2>&1 || { echo "rc=$?"; tail -5 $OUT/smoke.txt; exit 1; }
for v in 0 1; do
  export SPARSA_COOP_X_F16=$v
  echo "== X_F16=$v: lib tests kernels::"
  timeout 150 /tmp/libtest kernels:: --test-threads=4 > /tmp/lt$v.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" /tmp/lt$v.txt | head -8 | cut -c1-250
  echo "== X_F16=$v: goldens"
  timeout 200 /tmp/golden --test-threads=2 --nocapture > /tmp/gd$v.txt 2>&1; echo "rc=$?"; grep -E "test result|max \|Δ|tolerance|argmax|greedy" /tmp/gd$v.txt | head -40 | cut -c1-250
done
cat /tmp/lt0.txt /tmp/lt1.txt > $OUT/libtests.txt; cat /tmp/gd0.txt /tmp/gd1.txt > $OUT/goldens.txt
for v in 0 1; do
  echo "== X_F16=$v: gemm_shapes"
  SPARSA_COOP_X_F16=$v timeout 100 /tmp/gemm_shapes q4,bf16 5 512,2048 > /tmp/g.txt 2>&1; echo "rc=$?"
  cat /tmp/g.txt >> $OUT/gemm_shapes.txt
  grep -E "^(q4|bf16): " /tmp/g.txt | grep -v matrix | awk '{printf "%s%s@%s=%s ", $1, $2, $(NF-6), $(NF-1)} END {print ""}'
done
