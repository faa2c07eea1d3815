#!/bin/bash
# 2026-12-06 (fourth session), first call: where the time goes now, at full depth and per
# shape, before changing anything.
#   - gemv_shapes q4 at 1, 4 and 8 x rows (x quantized once), the routed experts' two products
#     included (never run on a GPU before): the defaults, then knobs that bound or retune the
#     experts' rows kernel (SPARSA_XQ_LO=0: x's lo words left out, inexact, what they cost;
#     SPARSA_EXPERT_BATCH=8 / 2; SPARSA_ROWS_QUADS=2).
#   - Full depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP layer, context 4,096), profiled:
#     batch 1 / 8, a 4-position verification, and a 2,048-token prefill with --calibrate (per
#     kernel % of the tensor-core peak).
# Every output in one archive ($OUT/run1.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/gemv_shapes
R=/tmp/run1; mkdir -p $R
D=/tmp/m
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
for v in auto "SPARSA_XQ_LO=0" "SPARSA_EXPERT_BATCH=8" "SPARSA_EXPERT_BATCH=2" "SPARSA_ROWS_QUADS=2" auto; do
  e=""; [ "$v" = auto ] || e="$v"
  f="$R/shapes.${v// /+}.$SECONDS.txt"
  env $e SPARSA_GEMV_XQ=1 timeout 60 /tmp/gemv_shapes q4 20 1,4,8 > "$f" 2>&1
  echo "== shapes $v (rc $?): $(grep -E '^q4x[148]: (all|routed)' "$f" | tr -s ' ' | cut -d' ' -f1,2,3,6,7 | tr '\n' ' ')"
done
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
timeout 90 $S bench --model $D --context 4096 --decode 8 --batch 1,8 > $R/batch.txt 2>&1
grep -hE "^bench: batched|rror" $R/batch.txt | cut -c1-120
timeout 60 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 > $R/verify.txt 2>&1
grep -hE "^bench: (verify|decode at)|rror" $R/verify.txt | cut -c1-160
timeout 120 $S bench --model $D --context 4096 --decode 4 --prompt-len 2048 --calibrate > $R/prefill.txt 2>&1
grep -hE "^bench: prefill|rror" $R/prefill.txt | cut -c1-120
rm -rf $D
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
