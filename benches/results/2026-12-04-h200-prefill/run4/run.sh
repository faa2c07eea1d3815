#!/bin/bash
# Issue 20: prefill with the restaged tile (run3) at chunks of 128 / 512 (the new default) /
# 1,024 / 2,048 rows (SPARSA_PREFILL_CHUNK) on the 4-layer GLM-5 q4 synth, then the 78-layer
# one (--zeros) at 512 and 1,024.
set -u
. benches/h200_setup.sh
D=/tmp/m4
( time $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== calibrate + profile, chunk 512"
timeout 150 $S bench --model $D --calibrate --context 8192 --decode 4 --prompt-len 2048,4096,8192 > $OUT/prof512.txt 2>&1
grep -E "^prefill|^decode|rror|matmul_coop|mla::mla |up_v|absorb" $OUT/prof512.txt | cut -c1-150 | head -30
for rep in a b; do for c in 128 512 1024 2048; do
  echo "== chunk $c ($rep)"
  SPARSA_PREFILL_CHUNK=$c timeout 100 $S bench --model $D --context 8192 --decode 4 --prompt-len 2048,4096,8192 --no-profile > $OUT/chunk$c-$rep.txt 2>&1
  grep -E "^prefill|rror" $OUT/chunk$c-$rep.txt | cut -c1-150 | head -4
done; done
rm -rf $D
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D ) 2>&1 | tail -3
for c in 512 1024; do
  echo "== 78 layers, chunk $c"
  SPARSA_PREFILL_CHUNK=$c timeout 150 $S bench --model $D --context 8192 --decode 4 --prompt-len 2048,8192 --no-profile > $OUT/full-chunk$c.txt 2>&1
  grep -E "^prefill|^decode|rror" $OUT/full-chunk$c.txt | cut -c1-150 | head -4
done
rm -rf $D
