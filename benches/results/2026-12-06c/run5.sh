#!/bin/bash
# 2026-12-06 (third session), after run4: the new defaults of the few-rows integer-dot
# GEMVs against the old ones, on a GPU:
#   - subgroup-shuffle reductions in gemv_dot_experts_rows always, and in gemv_dot_rows where
#     a lane takes at most 6 words of a row (SPARSA_DOT_SG=0: none; =1: every few-rows
#     kernel, what run2 of 2026-12-06-h200 measured 65.4 ms against 68.2–68.7 on an H100);
#   - one int-to-float conversion per q4 word and x row (SPARSA_DOT_I2F=2: two, as before).
# The matmul lib tests, goldens and batch tests under the defaults, the GLM-5 decode shapes at
# 1 and 8 rows, then full depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP layer, context
# 4,096: batch 1 / 8 and a 4-position verification) alternated, and one 2,048-token prefill.
# Every output in one archive ($OUT/run5.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes
R=/tmp/run5; mkdir -p $R
D=/tmp/m
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
timeout 90 /tmp/libtest kernels::matmul:: --test-threads=2 > $R/lib.txt 2>&1
echo "matmul lib tests (rc $?): $(grep 'test result' $R/lib.txt)"
timeout 120 /tmp/golden --test-threads=2 --skip quantize_is_reproducible > $R/golden.txt 2>&1
echo "goldens (rc $?): $(grep 'test result' $R/golden.txt)"
timeout 60 /tmp/batchtest --test-threads=1 > $R/batch.txt 2>&1
echo "batch tests (rc $?): $(grep 'test result' $R/batch.txt)"
for r in 1 2; do
  for v in auto "SPARSA_DOT_SG=0" "SPARSA_DOT_SG=1" "SPARSA_DOT_I2F=2"; do
    e=""; [ "$v" = auto ] || e="$v"
    f="$R/shapes.$r.${v// /+}.txt"
    env $e SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,8 > "$f" 2>&1
    echo "== shapes $r, $v (rc $?): $(grep -E '^q4x[18]: all' "$f" | tr -s ' ' | cut -d' ' -f1,4,5 | tr '\n' ' ')"
  done
done
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-540} - SECONDS)); }
timeout 60 $S bench --model $D --context 4096 --decode 4 --prompt-len 2048 --no-profile > $R/pf.txt 2>&1
grep -hE "bench: prefill|rror" $R/pf.txt | cut -c1-120
for v in auto "SPARSA_DOT_SG=0" "SPARSA_DOT_SG=1" "SPARSA_DOT_I2F=2" auto "SPARSA_DOT_SG=0" "SPARSA_DOT_SG=1" "SPARSA_DOT_I2F=2"; do
  [ $(left) -gt 75 ] || break
  e=""; [ "$v" = auto ] || e="$v"
  echo "== full depth, $v [$SECONDS s]"
  env $e timeout 40 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > "$R/bt.${v// /+}.$SECONDS.txt" 2>&1
  ls -t "$R"/bt.${v// /+}.*.txt | head -1 | xargs grep -hE "^bench: batched|rror" | cut -c1-120
  env $e timeout 30 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > "$R/v.${v// /+}.$SECONDS.txt" 2>&1
  ls -t "$R"/v.${v// /+}.*.txt | head -1 | xargs grep -hE "^  verif|rror" | cut -c1-120
done
rm -rf $D
tar czf $OUT/run5.tgz -C $R .
echo "[$SECONDS s]"
