#!/bin/bash
# 2026-12-06: the integer-dot GEMVs' lane reductions through subgroup shuffles
# (SPARSA_DOT_SG: 0 the workgroup-memory tree, the default; 1 the few-rows kernels; 2 every
# integer-dot GEMV). Their two lib tests (both reductions), the goldens and batch tests with
# =2, the GLM-5 decode shapes at 1, 2, 4, 8 rows alternated twice, then full depth (GLM-5 q4
# synth, 78 layers, 16 experts, MTP layer, context 4,096): batch 1 / 8 and a 4-position
# verification, 0 / 2 / 1 alternated while the call's time lasts (LIMIT, default 520 s).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes*
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $OUT/synth.txt &
SY=$!
timeout 100 /tmp/libtest kernels::matmul::tests::integer_dot kernels::matmul::tests::xq_gemv --test-threads=2 > $OUT/matmul.txt 2>&1
echo "lib tests (rc $?): $(grep 'test result' $OUT/matmul.txt)"
grep -E "panicked" -A3 $OUT/matmul.txt | head -8 | cut -c1-300
SPARSA_DOT_SG=2 timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests, DOT_SG=2 (rc $?): $(grep 'test result' $OUT/batch.txt)"
SPARSA_DOT_SG=2 timeout 120 /tmp/golden --test-threads=2 --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens, DOT_SG=2 (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -E "panicked" -A3 $OUT/goldens.txt | head -6 | cut -c1-250
for pass in a b; do
  for sg in 0 1 2; do
    SPARSA_DOT_SG=$sg SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,2,4,8 > $OUT/shapes.sg$sg.$pass.txt 2>&1
    echo "== shapes, DOT_SG=$sg ($pass, rc $?): $(grep -E '^q4x.: all' $OUT/shapes.sg$sg.$pass.txt | tr -s ' ' | cut -d' ' -f1,5 | tr '\n' ' ')"
  done
done
wait $SY; cat $OUT/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-520} - SECONDS)); }
for sg in 0 2 1 0 2 1; do
  [ $(left) -gt 40 ] || break
  echo "== full depth, DOT_SG=$sg [$SECONDS s]"
  SPARSA_DOT_SG=$sg timeout 50 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.sg$sg.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $OUT/bt.sg$sg.*.txt | tail -2 | cut -c1-120
  [ $(left) -gt 25 ] || break
  SPARSA_DOT_SG=$sg timeout 40 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.sg$sg.$SECONDS.txt 2>&1
  grep -hE "^  verif|rror" $OUT/v.sg$sg.*.txt | tail -1 | cut -c1-120
done
rm -rf $D
echo "[$SECONDS s]"
