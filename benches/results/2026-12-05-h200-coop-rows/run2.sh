#!/bin/bash
# Second call, right after run1.sh (same bundle and carry): the few-rows GEMVs on tensor
# cores at full depth (GLM-5 q4 synth, 78 layers, 16 experts, its MTP layer, context 4,096):
# a batched step of 1 and 8 sequences and a 4-position verification, SPARSA_ROWS_COOP
# 0 / 1 / 2 alternated, with one profiled run of each at 8 rows.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
left() { echo $((580 - SECONDS)); }
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
for v in 0 1 2 0 1 2; do
  [ $(left) -gt 70 ] || break
  echo "== full depth, SPARSA_ROWS_COOP=$v [$SECONDS s]"
  SPARSA_ROWS_COOP=$v timeout 60 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$v.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.$v.*.txt | tail -3 | cut -c1-200
  [ $(left) -gt 50 ] || break
  SPARSA_ROWS_COOP=$v timeout 60 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$v.$SECONDS.txt 2>&1
  grep -hE "verif|rror" $OUT/v.$v.*.txt | tail -3 | cut -c1-200
done
for v in 0 1; do
  [ $(left) -gt 60 ] || break
  SPARSA_ROWS_COOP=$v timeout 60 $S bench --model $D --context 4096 --decode 8 --batch 8 > $OUT/bt-prof.$v.txt 2>&1
  grep -E "gemv|experts|sequences" $OUT/bt-prof.$v.txt | head -8 | cut -c1-160
done
[ "${KEEP_SYNTH:-0}" = 1 ] || rm -rf $D   # KEEP_SYNTH=1: left for run3.sh
echo "[$SECONDS s]"
