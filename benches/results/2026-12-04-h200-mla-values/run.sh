#!/bin/bash
# Not run yet: written on 2026-12-04 when no device machine was lent. For the next session
# with an H200 (build the bundle as benches/h200_check.sh says, carry .gl and .h200, run from
# the repository root; ~8 minutes):
# 1. correctness on tensor cores: the kernel lib tests and the goldens (h200_check.sh), then
#    the attention lib tests again with mla_values' weights staged K-major
#    (SPARSA_COOP_GATHER=1, off by default until this passes) and with the MLA GEMMs at every
#    row count (SPARSA_MLA_GEMM=3: a decode step's and a verification's rows too, the values
#    product split over the positions and summed by mla_sum);
# 2. the 4-layer GLM-5 q4 prefill with and without the K-major staging, one binary, and a
#    profile of each (mla_values: 36.9 ms at 2,048 tokens on 2026-12-04, 60 % of mla_logits'
#    rate);
# 3. a 4-position verification and an 8-sequence batched step with the MLA GEMMs
#    (SPARSA_MLA_GEMM=3) against the mla kernel (the default), profiled.
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden
bash benches/h200_check.sh
for v in "SPARSA_COOP_GATHER=1" "SPARSA_MLA_GEMM=3" "SPARSA_COOP_GATHER=1 SPARSA_MLA_GEMM=3"; do
  env $v timeout 200 /tmp/libtest kernels::attention --test-threads=4 > "$OUT/attn.${v// /.}.txt" 2>&1
  echo "attention lib tests, $v (rc $?): $(grep 'test result' "$OUT/attn.${v// /.}.txt")"
done
D=/tmp/glm5-4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 || exit 1
for g in 1 0 1 0; do
  SPARSA_COOP_GATHER=$g timeout 100 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/b4.$g.txt 2>&1
  echo "== gather $g"; grep -E "^prefill|rror" $OUT/b4.$g.txt | cut -c1-150
done
for g in 1 0; do
  SPARSA_COOP_GATHER=$g timeout 100 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048 --calibrate > $OUT/prof4.$g.txt 2>&1
  echo "== profile gather $g"; grep -E "^prefill|mla|gemm|softmax|qcat" $OUT/prof4.$g.txt | head -10 | cut -c1-150
done
for m in 3 1; do
  SPARSA_COOP_GATHER=1 SPARSA_MLA_GEMM=$m timeout 100 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 > $OUT/v4.$m.txt 2>&1
  echo "== verify 3, SPARSA_MLA_GEMM=$m"; grep -E "verif|mla|rror" $OUT/v4.$m.txt | head -14 | cut -c1-150
  SPARSA_COOP_GATHER=1 SPARSA_MLA_GEMM=$m timeout 100 $S bench --model $D --context 4096 --decode 8 --batch 1,8 > $OUT/bt4.$m.txt 2>&1
  echo "== batch 1,8, SPARSA_MLA_GEMM=$m"; grep -E "batch|mla|rror" $OUT/bt4.$m.txt | head -14 | cut -c1-150
done
rm -rf $D
