#!/bin/bash
# Sparse MLA of prefill as GEMMs on the tensor-core tile (sparse_mla_gemm): the kernel lib
# tests and the goldens on tensor cores, then the 4-layer GLM-5 q4 prefill with the GEMMs
# (default) and the mla kernel (SPARSA_MLA_GEMM=0), alternated, one binary; a profile of each.
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden
bash benches/h200_check.sh
D=/tmp/glm5-4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1 || exit 1
for rep in a b; do
  for g in 1 0; do
    echo "== gemm $g ($rep)"
    SPARSA_MLA_GEMM=$g timeout 120 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/b4.$g.$rep.txt 2>&1
    grep -E "^prefill|^decode|rror" $OUT/b4.$g.$rep.txt | cut -c1-150
  done
done
for g in 1 0; do
  SPARSA_MLA_GEMM=$g timeout 120 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048 --calibrate > $OUT/prof4.$g.txt 2>&1
  echo "== profile gemm $g"; grep -E "mla|gemm|softmax|qcat" $OUT/prof4.$g.txt | head -12 | cut -c1-160
done
