#!/bin/bash
# Issue 23 on the H200, one device call: what bounds the several-row q4 GEMVs of a batched
# decode step. The calibrated peaks (copy, f32 FMA, 8-bit dot4); the GLM-5 decode shapes one
# matrix at a time (examples/gemv_shapes.rs) at 1, 2, 4 and 8 rows of x, then lanes per
# row group at 8 rows; then `sparsa bench --batch` of the 78-layer GLM-5 q4 synth (random
# weights, 16 experts, 512 positions) with 8, 4 (the default) and 2 slots per expert pass.
# (Run 1 of benches/results/2026-12-04-h200-rows also timed an f32 variant of the rows
# kernels, since removed.)
# Needs .h200/sparsa.xz, .h200/gemv_shapes.xz and .gl/. Results: $OUT/*.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
xz -dc .h200/gemv_shapes.xz > /tmp/gemv_shapes; chmod +x /tmp/gemv_shapes; G=/tmp/gemv_shapes
shapes() { # name, env..., then the rows list
  local name=$1; shift
  env "$@" timeout 200 $G q4 20 ${ROWS:-1,2,4,8} > $OUT/shapes-$name.txt 2>&1
  grep -E "copy bandwidth|: all|rror" $OUT/shapes-$name.txt
}
echo "== integer dot"; shapes int SPARSA_NONE=0
for t in 8 16 64; do echo "== tpr $t"; ROWS=8 shapes int-tpr$t SPARSA_GEMV_TPR=$t; done
if [ -z "${NO_SYNTH:-}" ]; then
  D=/tmp/m
  ( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
  for k in SPARSA_EXPERT_BATCH=8 SPARSA_EXPERT_BATCH=4 SPARSA_EXPERT_BATCH=2; do
    echo "== batch $k"
    env $k timeout 150 $S bench --model $D --context 512 --decode 16 --prompt-len 0 \
      --batch 2,4,8 > $OUT/batch-${k/=/-}.txt 2>&1
    grep -E "^bench: batched|rror" $OUT/batch-${k/=/-}.txt
    grep -E "gemv_dot_experts_rows|gemv_dot_rows" $OUT/batch-${k/=/-}.txt
  done
  rm -rf $D
fi
