#!/bin/bash
# 2026-12-06 (fifth session), second call, bundle of the commit that adds experts_direct (the
# routed experts through the direct tensor-core GEMM: slots sorted by expert, x split into
# planes in that order, experts decoded to f16 a group at a time) and SPARSA_DIRECT_RN (2:
# 32 x 32 a subgroup, for half the registers). Issue 20.
#   1. lib tests of the direct GEMMs (dense and experts) against the CPU decode, RN 4 and 2.
#   2. examples/gemm_shapes q4 at 512 and 2,048 rows: the tiles (DIRECT=0), direct RN=4,
#      direct RN=2 (every dispatch of a product timed: sort, split and decode included).
#   3. Register counts of the direct kernels at RN 2 (bench --shader-stats, 4 layers).
#   4. 4-layer GLM-5 q4 prefill of 2,048 tokens: 0, 1 (RN 4), 1 (RN 2), twice.
#   5. Issue 20's 4-layer target side by side: transformers (bf16, sdpa) prefill of 4,096 tokens
#      on a bf16 synth of the same shape (benches/transformers_decode.py), and sparsa q4 at
#      4,096 (default kernels), in this call.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
D4=/tmp/m4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
for rn in 4 2; do
  SPARSA_DIRECT_RN=$rn timeout 60 /tmp/libtest direct_gemm > $R/libtest.rn$rn.txt 2>&1
  echo "== libtest direct_gemm RN=$rn (rc $?): $(grep -E 'test result|panicked' $R/libtest.rn$rn.txt | head -3)"
done
for v in "0 4" "1 4" "1 2"; do
  set -- $v
  SPARSA_COOP_DIRECT=$1 SPARSA_DIRECT_RN=$2 timeout 100 /tmp/gemm_shapes q4 5 512,2048 > $R/shapes.d$1.rn$2.txt 2>&1
  echo "== shapes DIRECT=$1 RN=$2 (rc $?)"; grep -E "^q4: [a-z]" $R/shapes.d$1.rn$2.txt | cut -c1-100
done
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
SPARSA_COOP_DIRECT=1 SPARSA_DIRECT_RN=2 timeout 90 $S bench --model $D4 --context 600 --decode 2 --prompt-len 512 --no-profile --shader-stats > $R/stats.rn2.txt 2>&1
echo "== stats RN=2 (rc $?)"; grep -E "matmul_direct|rror" $R/stats.rn2.txt | cut -c1-160
timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
for r in 1 2; do
  for v in "0 4" "1 4" "1 2"; do
    set -- $v
    f=$R/pf4.$r.d$1.rn$2.txt
    SPARSA_COOP_DIRECT=$1 SPARSA_DIRECT_RN=$2 timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $f 2>&1
    echo "== 4 layers $r DIRECT=$1 RN=$2 (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120)"
  done
done
timeout 90 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 4096 --no-profile > $R/pf4.4096.txt 2>&1
echo "== sparsa q4 4 layers 4096 (rc $?): $(grep -hE '^bench: prefill|rror' $R/pf4.4096.txt | cut -c1-120)"
rm -rf $D4
left() { echo $((${LIMIT:-560} - SECONDS)); }
if [ $(left) -gt 200 ]; then
  timeout 90 $S synth --like glm-5 --layers 4 --experts 16 --format bf16 --out /tmp/mb > $R/synth-bf16.txt 2>&1
  timeout $(( $(left) - 30 )) python3 benches/transformers_decode.py --model /tmp/mb --contexts 4096,4096 --decode 2 --json $R/tf.json > $R/tf.txt 2>&1
  echo "== transformers bf16 4 layers (rc $?)"; tail -5 $R/tf.txt | cut -c1-200
  rm -rf /tmp/mb
fi
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
