#!/bin/bash
# 2026-12-06 (eighth session), the short call: the router's GEMV and routing in one dispatch
# for up to 8 rows (.h200/sparsa-rg.xz, 383934e) against one row only (.h200/sparsa.xz,
# 2b9c372): the built-in model, ROMEO prompt, 1,000 greedy tokens, no drafts and --draft 3,
# alternated three times; each text hashed. Carries .gl and .h200 only.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
M=models/sparsa-bard-12m
one() {
  local r=$1 b=$2 k=$3
  echo "== $r $b --draft $k" >> $R/bard.txt
  timeout 60 /tmp/$b generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
  echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
  grep -E "tok/s|drafts:|rror" $R/err.txt >> $R/bard.txt
}
for r in 1 2 3; do one $r sparsa 0; one $r sparsa 3; one $r sparsa-rg 0; one $r sparsa-rg 3; done
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | cut -c1-200
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
