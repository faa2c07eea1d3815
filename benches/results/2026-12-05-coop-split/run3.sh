#!/bin/bash
# 2026-12-05 night, second build: the stages in 8-byte f16 quads stored on distinct banks,
# 64 columns a workgroup by default. The matmul lib tests with the tensor-core rows at every
# row count, the GLM-5 decode shapes (integer-dot rows against tensor cores, same call), then
# run2.sh's full-depth part (batched-greedy tests, goldens, batch 1/8 and a 4-position
# verification alternated).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real &
SY=$!
for v in "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=128"; do
  n=$(echo $v | tr ' =' '__')
  env $v timeout 60 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.$n.txt 2>&1
  echo "matmul lib tests, $v (rc $?): $(grep 'test result' $OUT/matmul.$n.txt)"
  grep -E "panicked|FAILED|max err|mismatch" $OUT/matmul.$n.txt | head -4 | cut -c1-300
done
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=128"; do
  n=$(echo $v | tr ' =' '__')
  env $v SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,2,4,8 > $OUT/shapes.$n.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_a |o  |lm_head)" $OUT/shapes.$n.txt | cut -c1-100
done
echo "[$SECONDS s]"
SPARSA_ROWS_COOP=1 timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests, SPARSA_ROWS_COOP=1 (rc $?): $(grep 'test result' $OUT/batch.txt)"; grep -E "panicked" $OUT/batch.txt | head -3 | cut -c1-250
SPARSA_ROWS_COOP=2 timeout 120 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens, SPARSA_ROWS_COOP=2 (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -E "panicked|tolerance|argmax" $OUT/goldens.txt | head -6 | cut -c1-250
wait $SY
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-570} - SECONDS)); }
for v in ${SETS:-SPARSA_ROWS_COOP=0 SPARSA_ROWS_COOP=1 SPARSA_ROWS_COOP=0 SPARSA_ROWS_COOP=1}; do
  [ $(left) -gt 50 ] || break
  n=$(echo $v | tr ',=' '__')
  echo "== full depth, $v [$SECONDS s]"
  env $(echo $v | tr ',' ' ') timeout 50 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$n.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.$n.*.txt | tail -2 | cut -c1-200
  [ $(left) -gt 35 ] || break
  env $(echo $v | tr ',' ' ') timeout 40 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$n.$SECONDS.txt 2>&1
  grep -hE "verif|rror" $OUT/v.$n.*.txt | tail -2 | cut -c1-200
done
rm -rf $D
tar -C $OUT -cJf /tmp/raw.tar.xz . && mv /tmp/raw.tar.xz $OUT/raw.tar.xz
echo "[$SECONDS s]"
