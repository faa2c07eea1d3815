#!/bin/bash
# 2026-12-05 night: the few-rows tensor-core GEMVs rewritten (two subgroups of RC / 2 columns,
# K split into ranges for the dense kernel). Checks on the real driver (the matmul lib tests
# at SPARSA_ROWS_COOP=1 and 2, RC 128 and 64), then the GLM-5 decode shapes at 1, 2, 4, 8
# rows: integer-dot rows (0) against the tensor cores (2), with the split target swept.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
for v in "SPARSA_ROWS_COOP=1" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=64"; do
  n=$(echo $v | tr -cd '0-9' | cut -c1-4)
  env $v timeout 100 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.$n.txt 2>&1
  echo "matmul lib tests, $v (rc $?): $(grep 'test result' $OUT/matmul.$n.txt)"
  grep -E "panicked|FAILED|max err|mismatch" $OUT/matmul.$n.txt | head -6 | cut -c1-300
done
echo "[$SECONDS s]"
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_WGS=512" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_WGS=2048" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=64" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_KMIN=512"; do
  n=$(echo $v | tr ' =' '__')
  env $v SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,2,4,8 > $OUT/shapes.$n.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_a |kv_a|q_b|o  |lm_head|shared gate)" $OUT/shapes.$n.txt | cut -c1-100
done
echo "[$SECONDS s]"
