#!/bin/bash
# 2026-12-05 night: what the Vulkan memory model's ordering of workgroup memory costs the
# tensor-core kernels (src/gpu/spirv.rs `publish_workgroup_memory`; SPARSA_SPIRV_PUBLISH=0
# leaves it out, a measurement aid whose results may be wrong): the few-rows GEMVs on the
# GLM-5 decode shapes, and a 2,048-token prefill of a 4-layer GLM-5 q4 synth (the GEMM tile),
# each with and without, alternated.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/gemv_shapes
D=/tmp/m4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1 || echo "synth failed"
for p in 1 0 1 0; do
  env SPARSA_SPIRV_PUBLISH=$p SPARSA_ROWS_COOP=2 SPARSA_GEMV_XQ=1 timeout 40 /tmp/gemv_shapes q4 20 1,8 > $OUT/shapes.p$p.$SECONDS.txt 2>&1
  echo "== shapes, publish $p: $(grep -hE '^q4x.: all' $OUT/shapes.p$p.*.txt | tail -2 | tr -s ' ' | tr '\n' ' ')"
  env SPARSA_SPIRV_PUBLISH=$p timeout 60 $S bench --model $D --prompt-len 2048 --decode 1 --context 2048 --no-profile > $OUT/pf.p$p.$SECONDS.txt 2>&1
  echo "   prefill, publish $p: $(grep -hiE 'prefill' $OUT/pf.p$p.*.txt | tail -1 | cut -c1-160)"
done
head -2 $OUT/shapes.p1.*.txt | grep -i bandwidth | head -1
echo "[$SECONDS s]"
