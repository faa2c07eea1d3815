#!/bin/bash
# 2026-12-06 (ninth session), second call: full depth (GLM-5 q4 synth, 78 layers, 16 experts,
# MTP layer, context 4,096): an 8-sequence step against one, and a 4-position verification,
# with the router's GEMV and routing fused for up to 8 rows (sparsa-rg, d50e815) against one
# row (sparsa, 2b9c372), alternated twice, and e5a530c (sparsa-one) once; one 2,048-token
# prefill. Carries .gl, .h200 (the bundle of the three builds).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
D=/tmp/m
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
( time timeout 240 /tmp/sparsa-rg synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > $R/synth.log 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-560} - SECONDS)); }
for r in 1 2; do
  bs="sparsa sparsa-rg"; [ $r = 2 ] && bs="$bs sparsa-one sparsa-add"
  for b in $bs; do
    [ $(left) -gt 70 ] || break
    echo "== $r $b [$SECONDS s]"
    timeout 45 /tmp/$b bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $R/bt.$r.$b.txt 2>&1
    grep -hE "^bench: batched|rror" $R/bt.$r.$b.txt | cut -c1-140
    timeout 30 /tmp/$b bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $R/v.$r.$b.txt 2>&1
    grep -hE "^  verif|rror" $R/v.$r.$b.txt | cut -c1-140
  done
done
[ $(left) -gt 40 ] && timeout 40 /tmp/sparsa-rg bench --model $D --context 4096 --decode 4 --prompt-len 2048 --no-profile > $R/pf.txt 2>&1
grep -hE "bench: prefill|rror" $R/pf.txt | cut -c1-140
rm -rf $D
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
