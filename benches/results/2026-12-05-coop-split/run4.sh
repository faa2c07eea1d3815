#!/bin/bash
# 2026-12-05 night: what bounds the few-rows tensor-core GEMVs. The GLM-5 decode shapes at 1
# and 8 rows with parts of the K-step left out (SPARSA_ROWS_COOP_DIAG, wrong results, timing
# only): 1 no decoding of the weights, 2 no products, 3 no stores of the weights; beside the
# full kernel (0) and the integer-dot rows.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/gemv_shapes
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_DIAG=1" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_DIAG=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_DIAG=3" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_WGS=4096"; do
  n=$(echo $v | tr ' =' '__')
  env $v SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,8 > $OUT/shapes.$n.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_a |kv_a|o  |lm_head)" $OUT/shapes.$n.txt | cut -c1-100
done
head -2 $OUT/shapes.SPARSA_ROWS_COOP_0.txt
echo "[$SECONDS s]"
