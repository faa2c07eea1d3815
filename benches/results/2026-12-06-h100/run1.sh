#!/bin/bash
# 2026-12-06: the integer-dot GEMVs back to int-to-float conversions (i2f_small failed the
# matmul lib tests on an H100 and was slower at 8 rows: 2026-12-05-late-rows/run1 as run
# this session), checked on the device, then full depth (GLM-5 q4 synth, 78 layers, 16
# experts, MTP layer, context 4,096): batch 1 / 8, a 4-position verification and a 2,048-token
# prefill, this build against 1b8fcac's (sparsa-old), alternated while the call's time lasts.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes*
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $OUT/synth.txt &
SY=$!
timeout 100 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.txt 2>&1
echo "matmul lib tests (rc $?): $(grep 'test result' $OUT/matmul.txt)"
grep -E "panicked" -A3 $OUT/matmul.txt | head -8 | cut -c1-300
timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests (rc $?): $(grep 'test result' $OUT/batch.txt)"
timeout 120 /tmp/golden --test-threads=2 --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -E "panicked" -A3 $OUT/goldens.txt | head -6 | cut -c1-250
for g in old new; do
  b=/tmp/gemv_shapes; [ $g = old ] && b=/tmp/gemv_shapes-old
  SPARSA_GEMV_XQ=1 timeout 40 $b q4 20 1,8 > $OUT/shapes.$g.txt 2>&1
  echo "== shapes, $g (rc $?): $(grep -E '^q4x.: all' $OUT/shapes.$g.txt | tr -s ' ' | cut -c1-60 | tr '\n' ' ')"
done
# SPARSA_ROWS_WG=128 exited with 101 at 2 rows in the late-rows run1 (its output did not come
# back): the message.
SPARSA_ROWS_WG=128 SPARSA_GEMV_XQ=1 timeout 30 /tmp/gemv_shapes q4 2 2 > $OUT/wg128.txt 2>&1
echo "ROWS_WG=128 (rc $?):"; grep -iE "panic|error|caused|invalid" -A2 $OUT/wg128.txt | head -8 | cut -c1-250
wait $SY; cat $OUT/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-430} - SECONDS)); }
for b in new old new old; do
  [ $(left) -gt 45 ] || break
  bin=$S; [ $b = old ] && bin=/tmp/sparsa-old
  echo "== full depth, $b [$SECONDS s]"
  timeout 50 $bin bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$b.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.$b.*.txt | tail -2 | cut -c1-200
  [ $(left) -gt 35 ] || break
  timeout 40 $bin bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$b.$SECONDS.txt 2>&1
  grep -hE "verif|rror" $OUT/v.$b.*.txt | tail -2 | cut -c1-200
  [ $(left) -gt 40 ] || break
  timeout 40 $bin bench --model $D --prompt-len 2048 --decode 1 --context 2048 --no-profile > $OUT/pf.$b.$SECONDS.txt 2>&1
  grep -hiE "prefill|rror" $OUT/pf.$b.*.txt | tail -1 | cut -c1-200
done
rm -rf $D
echo "[$SECONDS s]"
