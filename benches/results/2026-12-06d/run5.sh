#!/bin/bash
# 2026-12-06 (fourth session), fifth call, bundle of 1c4c0f6: two workgroups an SM for the
# tensor-core tile? With 64-column tiles (SPARSA_COOP_TN=64) and the K loop's registers cut
# (SPARSA_COOP_KK=2 or 3) the tile may fit 128 registers (the MLA GEMMs, 64 columns, took 118-121
# under KK=3 in run4). Registers (bench --shader-stats) and 4-layer GLM-5 q4 prefill of 2,048
# tokens, after one warm-up run, alternated twice.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run5; mkdir -p $R
D4=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
for r in 1 2; do
  for v in "0 128" "0 64" "2 64" "3 64"; do
    set -- $v
    f=$R/pf.$r.kk$1.tn$2.txt
    SPARSA_COOP_KK=$1 SPARSA_COOP_TN=$2 timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile --shader-stats > $f 2>&1
    echo "== $r KK=$1 TN=$2 (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-90) | $(grep -E 'matmul_coop::gemm(_experts)?:' $f | grep -o 'Register Count [0-9]*' | tr '\n' ' ')"
  done
done
rm -rf $D4
tar czf $OUT/run5.tgz -C $R .
echo "[$SECONDS s]"
