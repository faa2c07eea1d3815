#!/bin/bash
# Issue 20: the GEMM tile's probes. SPARSA_COOP_PROBE bits: 1 = loads two K-steps ahead,
# 2 = x without its lo half (one f16 value), 4 = K-steps of 64. SPARSA_COOP_UNCHECKED:
# no naga bounds clamps in the tile's shader. Lib tests (matmul) per probe, then gemm_shapes.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
xz -dc .h200/libtest.xz > /tmp/lt; chmod +x /tmp/lt
xz -dc .h200/gemm_shapes.xz > /tmp/gs; chmod +x /tmp/gs
echo "== probe 0, q4 (stop if it hangs)"
timeout 60 /tmp/gs q4 5 512 > $OUT/smoke.txt 2>&1 || { echo "rc=$?"; tail -5 $OUT/smoke.txt; exit 1; }
for p in 0 1 4 5 2 6; do
  echo "== probe $p: lib tests kernels::matmul"
  SPARSA_COOP_PROBE=$p timeout 100 /tmp/lt kernels::matmul --test-threads=4 > /tmp/lt$p.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" /tmp/lt$p.txt | head -6 | cut -c1-200
done
cat /tmp/lt*.txt > $OUT/libtests.txt
for v in "0" "1" "4" "5" "2" "6" "7" "0 U" "5 U"; do
  set -- $v; p=$1
  echo "== probe $v"
  if [ $# -gt 1 ]; then export SPARSA_COOP_UNCHECKED=1; else unset SPARSA_COOP_UNCHECKED; fi
  SPARSA_COOP_PROBE=$p timeout 100 /tmp/gs q4,bf16 5 512,2048 > /tmp/g.txt 2>&1; echo "rc=$?"
  cat /tmp/g.txt >> $OUT/gemm_shapes.txt
  grep -E "^(q4|bf16): " /tmp/g.txt | grep -v matrix | awk '{printf "%s%s@%s=%s ", $1, $2, $(NF-6), $(NF-1)} END {print ""}'
done
