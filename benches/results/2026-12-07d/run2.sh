#!/bin/bash
# 2026-12-07 (fourth session), call 2: issue 20's full-depth targets as the code stands
# (78 layers, 16 experts, q4): prefill at 2,048 .. 32,768 tokens (the plot's points), and
# 8,192 tokens under --gpu-memory 24GiB. KNOBS (e.g. SPARSA_COOP_HK=32) applies to all.
# Carries .gl, .h200 (bundle.tar.xz). Everything lands in $OUT/run2.tar.xz.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
fin() { tar cJf $OUT/run2.tar.xz -C /tmp run2; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( time timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1 ) 2> $R/synth.time
echo "synth [$SECONDS s]"
pf() { f=$R/pf.$L.$w.txt; env ${KNOBS:-} timeout $((590-SECONDS)) $S bench --model $D --context $C --decode 2 --prompt-len $L --no-profile $flag > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
w=default flag=
for L in 2048 4096 8192 16384; do C=$((L + 64)); pf; fin; done
L=8192; C=8256; w=gpu24 flag="--gpu-memory 24GiB"; pf; fin
if [ $SECONDS -lt 420 ]; then L=32768; C=32832; w=default flag=; pf; fi
rm -rf $D; fin; echo "[$SECONDS s]"
