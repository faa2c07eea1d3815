#!/bin/bash
# The default prefill chunks under a --gpu-memory plan that streams experts (2,048 rows,
# plan_sized): full-depth GLM-5 q4 (random weights) under 24 GiB, prefill of 2,048 and 8,192
# tokens and decode after; the plan line says which chunks it reserved.
set -u
. benches/h200_setup.sh
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== 24GiB, default chunks"
RUST_LOG=info timeout 200 $S bench --model $D --context 8192 --decode 8 --prompt-len 2048,8192 --no-profile --gpu-memory 24GiB > $OUT/24g.txt 2>&1
grep -E "^prefill|^decode|rror|memory plan" $OUT/24g.txt | cut -c1-400 | head -8
rm -rf $D
