#!/bin/bash
# 2026-12-07, fourth call: issue 25's first target as shipped now: ad5564c's replayed GPU
# rounds (sparsa-rp) with the run3 MTP layer of 6065c03 (the model file comes from the
# tree): the built-in model, ROMEO prompt, 1,000 greedy tokens, no drafts against --draft 3
# and 4 (and 5 every other pass), alternated six times in one call. Carries .gl, .h200.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run4; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
B=/tmp/sparsa-rp
O=models/sparsa-bard-12m
for r in 1 2 3 4 5 6; do for k in 0 3 4 5; do
  [ $k = 5 ] && [ $((r % 2)) = 0 ] && continue
  timeout 60 $B generate -m $O -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.$r.$k.txt
  echo "$r k$k rc $? $(md5sum < $R/text.txt | cut -c1-12) $(grep -oE 'decode [0-9.]+ tok/s' $R/err.$r.$k.txt) $(grep -oE '[0-9.]+ tokens per verification|\([0-9]+ replayed\)|per round [0-9.]+ ms recording, [0-9.]+ ms waiting' $R/err.$r.$k.txt | tr '\n' ' ')" | tee -a $R/bard.txt
done; done
grep -h "per round:\|per token:" $R/err.6.*.txt
tar czf $OUT/run4.tgz -C $R .
echo "[$SECONDS s]"
