#!/bin/bash
# Issue 20: the tensor-core peak (bench --calibrate), the GEMM tile's q4 weights as one f16
# kernels on the H200 (where the tile runs on tensor cores).
set -u
. benches/h200_setup.sh
D=/tmp/m4
( time $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== calibrate + profile, 4-layer, prefill 2048 and 4096"
timeout 200 $S bench --model $D --calibrate --context 4096 --decode 2 --prompt-len 2048,4096 > $OUT/prof.txt 2>&1; grep -E "calibration|prefill|matmul|rror" $OUT/prof.txt | cut -c1-200 | head -40
for rep in a b; do for lo in 0 1; do
  echo "== Q4_LO=$lo ($rep)"
  SPARSA_COOP_Q4_LO=$lo timeout 200 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048,4096 --no-profile > $OUT/lo$lo-$rep.txt 2>&1
  grep -E "^prefill|rror" $OUT/lo$lo-$rep.txt | head -3
done; done
rm -rf $D
