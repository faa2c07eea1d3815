#!/bin/bash
# Issue 20 item 4: absorb_q and up_v at prefill as per-head GEMMs on the GEMM tile
# (gemm_heads), against the previous build (2059def, attention.wgsl's kernels).
# (1) the kernels' lib tests and the goldens on tensor cores; (2) 4-layer GLM-5 q4, profiled
# once, then both builds alternated; (3) 78 layers, both builds, and one profiled run.
set -u
OUT=${OUT:-benches/results/new}
bash benches/h200_check.sh
. benches/h200_setup.sh
O=/tmp/sparsa_old
D=/tmp/m4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1
echo "== 4 layers, profiled"
timeout 100 $S bench --model $D --calibrate --context 8192 --decode 4 --prompt-len 2048,4096,8192 > $OUT/prof4.txt 2>&1
grep -E "^prefill|gemm_heads|absorb|up_v|mla::mla " $OUT/prof4.txt | cut -c1-150
for rep in a b; do
  for b in new old; do
    B=$S; [ $b = old ] && B=$O
    echo "== 4 layers, $b ($rep)"
    timeout 100 $B bench --model $D --context 8192 --decode 4 --prompt-len 2048,4096,8192 --no-profile 2>&1 | grep -E "^prefill|rror" | cut -c1-150
  done
done
rm -rf $D
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
for b in new old; do
  B=$S; [ $b = old ] && B=$O
  echo "== 78 layers, $b"
  timeout 120 $B bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/full-$b.txt 2>&1
  grep -E "^prefill|rror" $OUT/full-$b.txt | cut -c1-200
done
echo "== 78 layers, new, profiled at 2048"
timeout 100 $S bench --model $D --calibrate --context 4096 --decode 2 --prompt-len 2048 > $OUT/prof78.txt 2>&1
grep -E "^prefill|^  [a-z]" $OUT/prof78.txt | head -14 | cut -c1-150
rm -rf $D
