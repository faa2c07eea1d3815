#!/bin/bash
# 2026-12-07 (third session), call 5: issue 20's 4-layer target side by side in one call:
# sparsa q4 (default: x as one f16 value) and bf16 on the 4-layer GLM-5 shape at 4,096 tokens,
# transformers bf16 (sdpa) on the bf16 synth, two passes (the second warm).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run5; mkdir -p $R
fin() { tar cJf $OUT/run5.tar.xz -C /tmp run5; }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out /tmp/m4 > /dev/null 2>&1
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format bf16 --out /tmp/m4b > /dev/null 2>&1
timeout 60 $S bench --model /tmp/m4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { f=$R/pf4.$n.$r.txt; timeout 40 $S bench --model $m --context 4160 --decode 2 --prompt-len 4096 --no-profile $flag > $f 2>&1
  echo "== sparsa 4 layers 4096 $n $r (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
for r in 1 2; do m=/tmp/m4 n=q4 flag=; p4; m=/tmp/m4 n=q4exact flag=--exact-gemms; p4; done
m=/tmp/m4b n=bf16 flag=; r=1; p4
fin
timeout 150 python3 benches/transformers_decode.py --model /tmp/m4b --contexts 4096,4096,4096 --decode 2 --json $R/tf.json > $R/tf.txt 2>&1
echo "== transformers (rc $?): $(grep -h prefill_tok_s $R/tf.txt | grep -o '"prefill_tok_s": [0-9.]*' | tr '\n' ' ') [$SECONDS s]"
r=3; m=/tmp/m4 n=q4 flag=; p4
fin; echo "[$SECONDS s]"
