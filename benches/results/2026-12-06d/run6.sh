#!/bin/bash
# 2026-12-06 (fourth session), sixth call, bundle of 1305235: the default prefill chunk of a
# session of its own at full depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP layer, no
# --gpu-memory), which now takes 2,048 rows where the memory left holds their scratch:
# prefill of 2,048 and 8,192 tokens with no --prefill-chunk.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run6; mkdir -p $R
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt
cat $R/synth.txt
for n in 2048 8192; do
  timeout 60 $S bench --model $D --context $((n + 64)) --decode 2 --prompt-len $n --no-profile > $R/pf.$n.txt 2>&1
  echo "default chunk: $(grep -hE "^bench: prefill|rror" $R/pf.$n.txt | cut -c1-120)"
done
rm -rf $D
tar czf $OUT/run6.tgz -C $R .
echo "[$SECONDS s]"
