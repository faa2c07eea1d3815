#!/bin/bash
# 2026-12-05 late, part 2 (about 8 minutes): full depth (GLM-5 q4 synth, 78 layers, 16
# experts, MTP layer, context 4,096): batch 1 / 8 and a 4-position verification, old build
# against new, new with 8 weight rows a lane, alternated; the batched-greedy tests and the
# goldens with SPARSA_ROWS_QUADS=2 while the synth is written.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/golden /tmp/batchtest
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real &
SY=$!
SPARSA_ROWS_QUADS=2 timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests, SPARSA_ROWS_QUADS=2 (rc $?): $(grep 'test result' $OUT/batch.txt)"; grep -E "panicked" $OUT/batch.txt | head -3 | cut -c1-250
SPARSA_ROWS_QUADS=2 timeout 120 /tmp/golden --test-threads=2 --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens, SPARSA_ROWS_QUADS=2 (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -E "panicked|tolerance|argmax" $OUT/goldens.txt | head -6 | cut -c1-250
wait $SY
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-570} - SECONDS)); }
for v in ${SETS:-old new new,SPARSA_ROWS_QUADS=2 new,SPARSA_ROWS_WG=128 old new new,SPARSA_ROWS_QUADS=2 new,SPARSA_ROWS_WG=128}; do
  [ $(left) -gt 50 ] || break
  set -- $(echo $v | tr ',' ' '); b=$1; shift
  bin=$S; [ $b = old ] && bin=/tmp/sparsa-old
  n=$(echo $v | tr ',=' '__')
  echo "== full depth, $v [$SECONDS s]"
  env "$@" timeout 50 $bin bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$n.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.$n.*.txt | tail -2 | cut -c1-200
  [ $(left) -gt 35 ] || break
  env "$@" timeout 40 $bin bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$n.$SECONDS.txt 2>&1
  grep -hE "verif|rror" $OUT/v.$n.*.txt | tail -2 | cut -c1-200
done
rm -rf $D
echo "[$SECONDS s]"
