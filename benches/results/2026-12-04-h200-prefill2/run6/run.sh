#!/bin/bash
# Issue 20: prefill with the final tile of this session (K-steps of 64, x in 16-byte loads,
# lo halves scaled): 4-layer GLM-5 q4 synth twice, then 78 layers with random weights.
set -u
. benches/h200_setup.sh
D=/tmp/m4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1
for rep in a b; do
  echo "== 4 layers ($rep)"
  timeout 100 $S bench --model $D --context 8192 --decode 4 --prompt-len 2048,4096,8192 --no-profile 2>&1 | grep -E "^prefill|rror" | cut -c1-150
done
rm -rf $D
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== 78 layers, resident"
timeout 150 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/full.txt 2>&1
grep -E "^prefill|^decode|rror" $OUT/full.txt | cut -c1-200
rm -rf $D
