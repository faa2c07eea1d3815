#!/bin/bash
# 2026-12-06 (fourth session), third call, bundle of the commit that makes SPARSA_DOT_I2F=3
# the default:
#   1. The driver's statistics of every kernel variant (sparsa bench --shader-stats, new):
#      a 4-layer GLM-5 q4 synth (the full-depth model's shapes and kernels) at batch 1 / 8, and
#      a 2,048-token prefill with a 4-position verification.
#   2. The built-in model's verification against its decode step, profiled (issue 25: what
#      bounds its drafts on a GPU).
#   3. Full depth (78 layers): prefill of 8,192 tokens in chunks of 512 and 2,048.
# Every output in one archive ($OUT/run3.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run3; mkdir -p $R
D=/tmp/m; D4=/tmp/m4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
timeout 120 $S bench --model $D4 --context 4096 --decode 4 --batch 1,8 --no-profile --shader-stats > $R/stats-batch.txt 2>&1
echo "stats, batch (rc $?): $(grep -c '::' $R/stats-batch.txt) lines"
grep -E "gemv_dot_experts_rows|gemv_dot_rows|gemv_dot_experts:|gemv_dot:|mla::mla:|mla_logits|rror" $R/stats-batch.txt | cut -c1-200 | head -20
timeout 150 $S bench --model $D4 --context 4096 --decode 4 --prompt-len 2048 --verify 3 --no-profile --shader-stats > $R/stats-prefill.txt 2>&1
echo "stats, prefill + verify (rc $?): $(grep -c '::' $R/stats-prefill.txt) lines"
grep -E "gemm|mla_values|rror" $R/stats-prefill.txt | cut -c1-200 | head -20
timeout 60 $S bench --context 200 --decode 16 --prompt-len 0 --verify 3 > $R/bard-verify.txt 2>&1
grep -E "^bench: (verify|decode at)|rror" $R/bard-verify.txt | cut -c1-200
rm -rf $D4
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-540} - SECONDS)); }
for c in 512 2048 512 2048; do
  [ $(left) -gt 60 ] || break
  timeout 70 $S bench --model $D --context 8256 --decode 2 --prompt-len 8192 --prefill-chunk $c --no-profile > $R/pf.$c.$SECONDS.txt 2>&1
  echo "chunk $c: $(ls -t $R/pf.$c.*.txt | head -1 | xargs grep -hE "^bench: prefill|rror" | cut -c1-120)"
done
rm -rf $D
tar czf $OUT/run3.tgz -C $R .
echo "[$SECONDS s]"
