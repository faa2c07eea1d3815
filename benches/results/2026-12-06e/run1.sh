#!/bin/bash
# 2026-12-06 (fifth session), first call, bundle of the commit after b025c81 (+ examples/gemm_shapes; the lib tests with direct_gemm_against_cpu_decode): the
# tensor-core GEMM without workgroup staging (gemm_direct, SPARSA_COOP_DIRECT=1) beside the
# tile, issue 20.
#   1. examples/gemm_shapes q4 at 512 and 2,048 rows, GEMM_DIRECT=1: each dense GLM-5 shape
#      through the tile, then gemm_direct (the GEMM alone, and with x's split and the weights'
#      decoding), and the largest difference between the two results; with the next K-step
#      loaded ahead (SPARSA_DIRECT_PF=1, default) and not (0).
#   2. The driver's register counts of the direct kernels (bench --shader-stats, 4-layer
#      synth, 512-token prefill).
#   3. 4-layer GLM-5 q4 prefill of 2,048 and 4,096 tokens, dense GEMMs through the tile or
#      gemm_direct, alternated twice after a warm-up.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
D4=/tmp/m4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
timeout 60 /tmp/libtest direct_gemm > $R/libtest.txt 2>&1
echo "== libtest direct_gemm (rc $?): $(grep -E 'test result|panicked' $R/libtest.txt | head -3)"
for pf in 1 0; do
  GEMM_DIRECT=1 SPARSA_DIRECT_PF=$pf timeout 150 /tmp/gemm_shapes q4 5 512,2048 > $R/shapes.pf$pf.txt 2>&1
  echo "== shapes PF=$pf (rc $?)"; grep -vE "^q4: experts" $R/shapes.pf$pf.txt | cut -c1-220
done
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
SPARSA_COOP_DIRECT=1 timeout 90 $S bench --model $D4 --context 600 --decode 2 --prompt-len 512 --no-profile --shader-stats > $R/stats.txt 2>&1
echo "== stats (rc $?)"; grep -E "matmul_direct|matmul_coop::gemm:|rror" $R/stats.txt | cut -c1-220
timeout 90 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
for r in 1 2; do
  for d in 0 1; do
    for n in 2048 4096; do
      f=$R/pf.$r.d$d.$n.txt
      SPARSA_COOP_DIRECT=$d timeout 90 $S bench --model $D4 --context $((n + 64)) --decode 2 --prompt-len $n --no-profile > $f 2>&1
      echo "== $r DIRECT=$d $n (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120)"
    done
  done
done
SPARSA_COOP_DIRECT=1 timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 > $R/prof.d1.txt 2>&1
echo "== profile DIRECT=1 (rc $?)"; grep -E "gemm|split_x|dequant_w|mla" $R/prof.d1.txt | head -12 | cut -c1-160
rm -rf $D4
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
