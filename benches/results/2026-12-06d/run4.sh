#!/bin/bash
# 2026-12-06 (fourth session), fourth call, bundle of 1c4c0f6: what takes the tensor-core
# tile's registers (about 210 a lane in run3: one workgroup an SM). SPARSA_COOP_KK 0-3 (bit 0:
# the products' K-step loop to a bound the compiler cannot see; bit 1: the next K-step loaded
# after the products): registers (bench --shader-stats) and prefill of 2,048 tokens on a
# 4-layer GLM-5 q4 synth, alternated twice; the matmul lib tests with both bits on (3).
# Every output in one archive ($OUT/run4.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest
R=/tmp/run4; mkdir -p $R
D4=/tmp/m4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
for r in 1 2; do
  for v in 0 1 2 3; do
    f=$R/pf.$r.$v.txt
    SPARSA_COOP_KK=$v timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile --shader-stats > $f 2>&1
    echo "== $r COOP_KK=$v (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-90) | $(grep -E 'matmul_coop::gemm(_experts)?:' $f | grep -o 'Register Count [0-9]*' | tr '\n' ' ')"
  done
done
SPARSA_COOP_KK=3 timeout 120 /tmp/libtest kernels::matmul:: --test-threads=2 > $R/lib.3.txt 2>&1
echo "matmul lib tests, COOP_KK=3 (rc $?): $(grep 'test result' $R/lib.3.txt)"
rm -rf $D4
tar czf $OUT/run4.tgz -C $R .
echo "[$SECONDS s]"
