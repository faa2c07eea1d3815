#!/bin/bash
# Issue 23 on the H200, one device call: the multi-row integer-dot GEMVs' knobs at a batched
# decode step of 8 sequences (the same random-weight 78-layer GLM-5 q4 synth as
# h200_batch.sh, 512 positions): default, SPARSA_ROWS_UNROLL=1, and lanes per row group
# (SPARSA_GEMV_TPR) 8, 16, 64. Each line: the batch of 8 against one sequence, same run.
# Needs .h200/sparsa.xz and .gl/. Results: $OUT/*.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
for k in SPARSA_NONE=0 SPARSA_ROWS_UNROLL=1 SPARSA_GEMV_TPR=8 SPARSA_GEMV_TPR=16 SPARSA_GEMV_TPR=64; do
  echo "== $k"
  env $k timeout 120 $S bench --model $D --context 512 --decode 16 --prompt-len 0 --batch 8 \
    > $OUT/knobs-${k/=/-}.txt 2>&1
  grep -E "^bench: batched|rror" $OUT/knobs-${k/=/-}.txt
  grep -E "gemv_dot_experts_rows|gemv_dot_rows|gemv_dot_experts\[|gemv_dot\[" $OUT/knobs-${k/=/-}.txt | head -4
done
rm -rf $D
