#!/bin/bash
# 2026-12-05 afternoon, first call (from the repository root, carry .gl and .h200; the bundle:
# sparsa, libtest, golden, batchtest, gemv_shapes): the few-rows GEMVs on tensor cores
# (gemv_coop_rows, gemv_coop_experts_rows; SPARSA_ROWS_COOP 0 = off (the default), 1 = 2+ rows,
# 2 = also one row) checked (matmul lib tests, goldens, batched greedy tokens) and timed
# (the GLM-5 shapes at 1, 2, 4, 8 rows; a 4-layer GLM-5 q4 synth's batched and verify steps).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
left() { echo $((580 - SECONDS)); }
for v in 1 2; do
  SPARSA_ROWS_COOP=$v timeout 100 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.$v.txt 2>&1
  echo "matmul lib tests, SPARSA_ROWS_COOP=$v (rc $?): $(grep 'test result' $OUT/matmul.$v.txt)"
  grep -E "panicked|FAILED|max err|mismatch" $OUT/matmul.$v.txt | head -6 | cut -c1-250
done
SPARSA_ROWS_COOP=1 timeout 100 /tmp/batchtest --test-threads=2 > $OUT/batch.txt 2>&1
echo "batch tests (rc $?): $(grep 'test result' $OUT/batch.txt)"; grep -E "panicked" $OUT/batch.txt | head -3 | cut -c1-250
echo "[$SECONDS s]"
for v in "SPARSA_ROWS_COOP=0" "SPARSA_ROWS_COOP=2" "SPARSA_ROWS_COOP=2 SPARSA_ROWS_COOP_COLS=64"; do
  f=${v// /.}
  env $v SPARSA_GEMV_XQ=1 timeout 60 /tmp/gemv_shapes q4 20 1,2,4,8 > $OUT/shapes.$f.txt 2>&1
  echo "== shapes, $v (rc $?)"; grep -E "^q4x.: (all|q_b|o  |lm_head|shared gate|kv_a)" $OUT/shapes.$f.txt | cut -c1-120
done
SPARSA_ROWS_COOP=1 SPARSA_ROWS_COOP_COLS=64 timeout 100 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.1.64.txt 2>&1
echo "matmul lib tests, SPARSA_ROWS_COOP=1 SPARSA_ROWS_COOP_COLS=64 (rc $?): $(grep 'test result' $OUT/matmul.1.64.txt)"
echo "[$SECONDS s]"
SPARSA_ROWS_COOP=2 timeout 150 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.2.txt 2>&1
echo "goldens, SPARSA_ROWS_COOP=2 (rc $?): $(grep 'test result' $OUT/goldens.2.txt)"
grep -E "panicked|tolerance|argmax" $OUT/goldens.2.txt | head -6 | cut -c1-250
echo "[$SECONDS s]"
D=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1
for v in 0 1 2 0 1; do
  [ $(left) -gt 40 ] || break
  SPARSA_ROWS_COOP=$v timeout 40 $S bench --model $D --context 4096 --decode 16 --batch 1,8 --no-profile > $OUT/b4.$v.txt 2>&1
  echo "== 4 layers, SPARSA_ROWS_COOP=$v: $(grep -E 'sequences|rror' $OUT/b4.$v.txt | head -3 | tr '\n' ' ' | cut -c1-300)"
  SPARSA_ROWS_COOP=$v timeout 40 $S bench --model $D --context 4096 --decode 16 --prompt-len 0 --verify 3 --no-profile > $OUT/v4.$v.txt 2>&1
  grep -E "verif|rror" $OUT/v4.$v.txt | head -3 | cut -c1-200
done
echo "[$SECONDS s]"
