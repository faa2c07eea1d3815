#!/bin/bash
# 2026-12-05 night: two K-steps' loads in flight in the few-rows tensor-core GEMVs
# (SPARSA_ROWS_COOP_DEPTH=2, the new default) against one; the matmul lib tests with them at
# every row count, then the GLM-5 decode shapes beside the integer-dot rows.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/gemv_shapes
SPARSA_ROWS_COOP=2 timeout 60 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.txt 2>&1
echo "matmul lib tests, SPARSA_ROWS_COOP=2 (rc $?): $(grep 'test result' $OUT/matmul.txt)"
grep -E "panicked|FAILED|max err|mismatch" $OUT/matmul.txt | head -4 | cut -c1-300
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_DEPTH=1" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=128" "SPARSA_ROWS_COOP=0"; do
  n=$(echo $v | tr ' =' '__')
  env $v SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,4,8 > $OUT/shapes.$n.$SECONDS.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_a |o  |lm_head)" $OUT/shapes.$n.*.txt | tail -12 | cut -c1-100
done
head -2 $OUT/shapes.SPARSA_ROWS_COOP_0.*.txt | tail -1
echo "[$SECONDS s]"
