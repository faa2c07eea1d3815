#!/bin/bash
# 2026-12-06, short (under 3 minutes, the session's device time nearly spent): the matmul lib
# tests with the integer-dot GEMVs reverted (7fe7fb5), the GLM-5 decode shapes against
# 1b8fcac's build at 1 and 8 rows, and SPARSA_ROWS_WG=128's exit message.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/gemv_shapes*
timeout 90 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.txt 2>&1
echo "matmul lib tests (rc $?): $(grep 'test result' $OUT/matmul.txt)"
grep -E "panicked" -A2 $OUT/matmul.txt | head -8 | cut -c1-300
for g in new old; do
  b=/tmp/gemv_shapes; [ $g = old ] && b=/tmp/gemv_shapes-old
  SPARSA_GEMV_XQ=1 timeout 30 $b q4 20 1,8 > $OUT/shapes.$g.txt 2>&1
  echo "== shapes, $g (rc $?): $(grep -E '^q4x.: all' $OUT/shapes.$g.txt | tr -s ' ' | cut -c1-60 | tr '\n' ' ')"
done
SPARSA_ROWS_WG=128 SPARSA_GEMV_XQ=1 timeout 20 /tmp/gemv_shapes q4 2 2 > $OUT/wg128.txt 2>&1
echo "ROWS_WG=128 (rc $?):"; grep -iE "panic|error|caused|invalid" -A2 $OUT/wg128.txt | head -8 | cut -c1-250
echo "[$SECONDS s]"
