#!/bin/bash
# 2026-12-06 (third session): two candidates for the few-rows integer-dot GEMVs (issues 23,
# 25), each a knob in this build:
#   SPARSA_DOT_SG=3   the subgroup-shuffle reductions where a lane takes ≤ 6 words of a row
#                     (gemv_dot_rows and gemv_dot_experts_rows), against the default (≤ 256
#                     workgroups, gemv_dot_rows only) and 0 (the workgroup-memory tree);
#   SPARSA_DOT_I2F=1  one int-to-float conversion per q4 word and x row instead of two.
# Lib tests and goldens under the candidates, the GLM-5 decode shapes at 1 and 8 rows, then
# full depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP layer, context 4,096: batch 1 / 8
# and a 4-position verification) alternated while the call lasts (LIMIT, default 540 s),
# the built-in model's drafts (issue 25) first, and SPARSA_ROWS_WG=128 (workgroups of 128
# in the few-rows kernels: finer occupancy steps) and SPARSA_ROWS_SEL=1 (gemv_dot_experts_rows'
# row offsets written at constant indices) beside them. Every output in one archive ($OUT/run4.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
R=/tmp/run4; mkdir -p $R
D=/tmp/m
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
T="kernels::matmul::tests::integer_dot kernels::matmul::tests::xq_gemv kernels::matmul::tests::dot_red kernels::matmul::tests::quantized_experts"
for e in "SPARSA_DOT_I2F=1" "SPARSA_DOT_SG=3" "SPARSA_DOT_SG=3 SPARSA_DOT_I2F=1" "SPARSA_ROWS_SEL=1"; do
  env $e timeout 90 /tmp/libtest $T --test-threads=2 > "$R/lib.$e.txt" 2>&1
  echo "lib tests, $e (rc $?): $(grep 'test result' "$R/lib.$e.txt")"
done
env SPARSA_DOT_I2F=1 SPARSA_DOT_SG=3 timeout 120 /tmp/golden --test-threads=2 > $R/golden.txt 2>&1
echo "goldens, I2F=1 SG=3 (rc $?): $(grep 'test result' $R/golden.txt)"
env SPARSA_DOT_I2F=1 SPARSA_DOT_SG=3 timeout 60 /tmp/batchtest --test-threads=1 > $R/batch.txt 2>&1
echo "batch tests, I2F=1 SG=3 (rc $?): $(grep 'test result' $R/batch.txt)"
M=models/sparsa-bard-12m
for k in 0 3 0 3; do
  echo "== built-in model, --draft $k" >> $R/bard.txt
  timeout 20 $S generate -m $M -p $'ROMEO.\nBut soft, what light through yonder window breaks?\n' -n 1000 --ignore-eos --temperature 0 --draft $k -v 2>&1 | grep -E "tok/s|drafts:|host ms|rror" >> $R/bard.txt
done
grep -E "==|decode|drafts" $R/bard.txt
for r in 1 2; do
  for v in auto "SPARSA_DOT_SG=0" "SPARSA_DOT_SG=3" "SPARSA_DOT_I2F=1" "SPARSA_DOT_SG=3 SPARSA_DOT_I2F=1" "SPARSA_ROWS_WG=128"; do
    e=""; [ "$v" = auto ] || e="$v"
    f="$R/shapes.$r.${v// /+}.txt"
    env $e SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,8 > "$f" 2>&1
    echo "== shapes $r, $v (rc $?): $(grep -E '^q4x[18]: all' "$f" | tr -s ' ' | cut -d' ' -f1,4,5 | tr '\n' ' ')"
  done
done
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-540} - SECONDS)); }
for v in auto "SPARSA_DOT_SG=3 SPARSA_DOT_I2F=1" "SPARSA_ROWS_SEL=1" "SPARSA_ROWS_WG=128" "SPARSA_DOT_SG=3" "SPARSA_DOT_I2F=1" auto "SPARSA_DOT_SG=3 SPARSA_DOT_I2F=1" "SPARSA_ROWS_SEL=1"; do
  [ $(left) -gt 75 ] || break
  e=""; [ "$v" = auto ] || e="$v"
  echo "== full depth, $v [$SECONDS s]"
  env $e timeout 40 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > "$R/bt.${v// /+}.$SECONDS.txt" 2>&1
  grep -hE "sequences|rror" "$R"/bt.${v// /+}.*.txt | tail -3 | cut -c1-120
  env $e timeout 30 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > "$R/v.${v// /+}.$SECONDS.txt" 2>&1
  grep -hE "^  verif|rror" "$R"/v.${v// /+}.*.txt | tail -1 | cut -c1-120
done
rm -rf $D
tar czf $OUT/run4.tgz -C $R .
echo "[$SECONDS s]"
