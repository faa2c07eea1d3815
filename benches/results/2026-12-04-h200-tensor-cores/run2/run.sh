#!/bin/bash
# Issue 20: the tensor-core peak (bench --calibrate) and the GEMM tile's q4 staging
# (SPARSA_COOP_Q4: 0 = one f16 value a weight, a word of nibbles per invocation, the
# default; 2 = one f16 value, element pairs; 1 = f16 hi + lo halves, element pairs, the
# tile before 2026-12-04), alternated in one call: a 4-layer GLM-5 q4 synth, then the
# 78-layer one (--zeros: every row routed to the same 8 experts).
set -u
. benches/h200_setup.sh
D=/tmp/m4
( time $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== calibrate + profile, 4-layer, prefill 2048 and 4096"
timeout 200 $S bench --model $D --calibrate --context 4096 --decode 2 --prompt-len 2048,4096 > $OUT/prof.txt 2>&1; grep -E "calibration|prefill|matmul_coop|rror" $OUT/prof.txt | cut -c1-200 | head -20
for rep in a b; do for m in 0 2 1; do
  echo "== SPARSA_COOP_Q4=$m ($rep)"
  SPARSA_COOP_Q4=$m timeout 200 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048,4096 --no-profile > $OUT/q4mode$m-$rep.txt 2>&1
  grep -E "^prefill|rror" $OUT/q4mode$m-$rep.txt | head -3
done; done
rm -rf $D
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D ) 2>&1 | tail -3
for m in 0 1; do
  echo "== 78 layers, SPARSA_COOP_Q4=$m"
  SPARSA_COOP_Q4=$m timeout 90 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048 --no-profile > $OUT/full-q4mode$m.txt 2>&1
  grep -E "^prefill|rror" $OUT/full-q4mode$m.txt | head -3
done
rm -rf $D
