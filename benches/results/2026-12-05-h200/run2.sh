#!/bin/bash
# Second device call of 2026-12-05 (from the repository root, the bundle of h200_check.sh plus
# examples/cpu_experts, carry .gl and .h200; ~9 minutes). Full-depth GLM-5 q4 synth (78
# layers, 16 experts, random weights, its MTP layer):
# 1. issues 23 and 25: an 8-sequence batched step and a 4-position verification, resident,
#    with a few rows on the GEMM tiles (SPARSA_GEMM_FROM_ROWS=2: tensor cores) and with the
#    MLA GEMMs at every row count (SPARSA_MLA_GEMM=3), against the defaults;
# 2. issue 22: the hybrid decode under --gpu-memory 24GiB with the q4 / q8 prefetch on and
#    off (from the prepared 2026-12-04-h200-prefetch/run.sh), which also measures the two
#    changes since the last H200 run (no thread for an empty write_batch, the routing
#    read-back in the layer's own submission), and the executor alone.
set -u
. benches/h200_setup.sh
chmod +x /tmp/cpu_experts
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
hybrid() {
  for p in 0 1; do
    echo "== hybrid, prefetch $p ($1)"
    SPARSA_CPU_PREFETCH=$p timeout 90 $S $B > $OUT/hy-$p-$1.txt 2>&1
    grep -E "decode at|CPU experts|routing|stalled|a token|host ms|rror" $OUT/hy-$p-$1.txt | cut -c1-300
  done
}
# Issues 23 and 25: an 8-sequence batched step and a 4-position verification, resident.
for v in "SPARSA_GEMM_FROM_ROWS=9" "SPARSA_GEMM_FROM_ROWS=2" "SPARSA_MLA_GEMM=3" "SPARSA_GEMM_FROM_ROWS=2 SPARSA_MLA_GEMM=3"; do
  f=${v// /.}
  echo "== full depth, $v"
  env $v timeout 75 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$f.txt 2>&1
  grep -E "sequences|rror" $OUT/bt.$f.txt | head -4 | cut -c1-200
  env $v timeout 75 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$f.txt 2>&1
  grep -E "verif|step|rror" $OUT/v.$f.txt | head -6 | cut -c1-200
done
hybrid a
for p in 0 1; do
  echo -n "executor alone, prefetch $p: "
  SPARSA_CPU_PREFETCH=$p RAYON_NUM_THREADS=16 timeout 30 /tmp/cpu_experts q4 64 40 2>/dev/null
done
rm -rf $D
