#!/bin/bash
# 2026-12-05 late morning: run1.sh's checks and run2.sh's full-depth benches in one call (the
# device time left would not hold three): the few-rows tensor-core GEMVs (SPARSA_ROWS_COOP=1/2)
# checked by the matmul lib tests, the batched-greedy tests and the goldens, then timed at full
# depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP; context 4,096): batch 1 and 8, and a
# 4-position verification, 0 / 1 / 2 alternated. KEEP_SYNTH=1 leaves the synth for run3.sh.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
# Raw outputs go to $OUT/raw.tar.xz after each phase (a call returns at most 8 files, and
# what a call cut short left under $OUT still comes back).
R=$OUT; OUT=/tmp/o; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw.tar.xz . ; }
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
left() { echo $((${LIMIT:-570} - SECONDS)); }
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real &
SY=$!
for v in 1 2; do
  SPARSA_ROWS_COOP=$v timeout 100 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.$v.txt 2>&1
  echo "matmul lib tests, SPARSA_ROWS_COOP=$v (rc $?): $(grep 'test result' $OUT/matmul.$v.txt)"
  grep -E "panicked|FAILED|max err|mismatch" $OUT/matmul.$v.txt | head -6 | cut -c1-250
done
SPARSA_ROWS_COOP=1 timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests (rc $?): $(grep 'test result' $OUT/batch.txt)"; grep -E "panicked" $OUT/batch.txt | head -3 | cut -c1-250
SPARSA_ROWS_COOP=2 timeout 120 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.2.txt 2>&1
echo "goldens, SPARSA_ROWS_COOP=2 (rc $?): $(grep 'test result' $OUT/goldens.2.txt)"
grep -E "panicked|tolerance|argmax" $OUT/goldens.2.txt | head -6 | cut -c1-250
echo "[$SECONDS s]"; save
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2"; do
  env $v SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,2,4,8 > $OUT/shapes.${v#*=}.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_b|o  |lm_head)" $OUT/shapes.${v#*=}.txt | cut -c1-120
done
wait $SY
echo "[$SECONDS s] synth done"
for v in 0 1 2 0 1 2; do
  [ $(left) -gt 60 ] || break
  echo "== full depth, SPARSA_ROWS_COOP=$v [$SECONDS s]"
  SPARSA_ROWS_COOP=$v timeout 60 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$v.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.$v.*.txt | tail -2 | cut -c1-200
  [ $(left) -gt 40 ] || break
  SPARSA_ROWS_COOP=$v timeout 50 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$v.$SECONDS.txt 2>&1
  grep -hE "verif|rror" $OUT/v.$v.*.txt | tail -2 | cut -c1-200
  save
done
[ "${KEEP_SYNTH:-0}" = 1 ] || rm -rf $D
save
echo "[$SECONDS s]"
