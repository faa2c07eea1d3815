#!/bin/bash
# Sparse MLA at prefill: (a) the row loads issued one step ahead of the products in both
# phases (sparsa = the change, sparsa_base = 45697b1), (b) heads per workgroup at prefill
# (SPARSA_MLA_HG 16, the default, 8, 4): 4-layer GLM-5 q4, profiled, 2,048 and 8,192 tokens.
set -u
. benches/h200_setup.sh
D=/tmp/m4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1
for rep in a b; do
  for hg in 16 8 4; do
    for b in sparsa sparsa_base; do
      echo "== $b HG=$hg ($rep)"
      SPARSA_MLA_HG=$hg timeout 100 /tmp/$b bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 > $OUT/$b-hg$hg-$rep.txt 2>&1
      grep -E "^prefill|mla::mla |rror" $OUT/$b-hg$hg-$rep.txt | head -4 | cut -c1-120
    done
  done
done
rm -rf $D
