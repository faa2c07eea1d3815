#!/bin/bash
# Issue 20: where the tensor-core GEMM tile's time goes (examples/gemm_shapes at 128, 512
# and 2,048 rows; SPARSA_COOP_PROBE: 0 = the tile; 1 = no multiply-adds; 2 = no loads from
# memory inside the K loop; 3 = no staging and no barriers inside the K loop; 4 = x's lo
# half dropped), then prefill at chunks of 128 / 512 / 1,024 rows (SPARSA_PREFILL_CHUNK) on
# the 4-layer GLM-5 q4 synth.
set -u
. benches/h200_setup.sh
xz -dc .h200/gemm_shapes.xz > /tmp/gs; chmod +x /tmp/gs
for p in 0 1 2 3 4; do
  echo "== probe $p"
  SPARSA_COOP_PROBE=$p timeout 120 /tmp/gs q4 5 128,512,2048 > $OUT/probe$p.txt 2>&1
  grep -E "q4:|rror|peak|TFLOP" $OUT/probe$p.txt | grep -v "matrix" | cut -c1-120
done
D=/tmp/m4
( time $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
for c in 128 512 1024; do
  echo "== chunk $c"
  SPARSA_PREFILL_CHUNK=$c timeout 150 $S bench --model $D --calibrate --context 4096 --decode 2 --prompt-len 2048,4096 > $OUT/chunk$c.txt 2>&1
  grep -E "^prefill|rror|matmul_coop|mla::mla |up_v|absorb" $OUT/chunk$c.txt | cut -c1-140 | head -16
done
rm -rf $D
