#!/bin/bash
# Issue 20 at full depth with real routing: a 78-layer GLM-5 q4 synth with random weights (16
# experts a layer; the router spreads the rows), prefill resident at 2,048 and 8,192 tokens,
# then under --gpu-memory 24GiB at 2,048 (chunks of 512: each streamed expert is uploaded once
# per chunk).
set -u
. benches/h200_setup.sh
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== resident"
timeout 150 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/full.txt 2>&1
grep -E "^prefill|^decode|rror" $OUT/full.txt | cut -c1-200
echo "== --gpu-memory 24GiB"
timeout 150 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048 --no-profile --gpu-memory 24GiB > $OUT/full-24g.txt 2>&1
grep -E "^prefill|^decode|rror|offload|plan" $OUT/full-24g.txt | cut -c1-250 | head -8
rm -rf $D
