#!/bin/bash
# 2026-12-07, second call: issue 25's first target with GPU rounds replayed (ad5564c,
# sparsa-rp): the built-in model, ROMEO prompt, 1,000 greedy tokens, no drafts against
# --draft 3 and 4, each with replay (default) and SPARSA_ROUND_REPLAY=0 (every round
# recorded, as before), alternated six times in one call. Carries .gl, .h200.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
B=/tmp/sparsa-rp
O=models/sparsa-bard-12m
for r in 1 2 3 4 5 6; do for v in "0 1" "3 1" "3 0" "4 1" "4 0"; do
  set -- $v
  SPARSA_ROUND_REPLAY=$2 timeout 60 $B generate -m $O -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $1 -v > $R/text.txt 2> $R/err.$r.$1.$2.txt
  echo "$r k$1 replay$2 rc $? $(md5sum < $R/text.txt | cut -c1-12) $(grep -oE 'decode [0-9.]+ tok/s' $R/err.$r.$1.$2.txt) $(grep -oE '[0-9.]+ tokens per verification|\([0-9]+ replayed\)|per round [0-9.]+ ms recording, [0-9.]+ ms waiting' $R/err.$r.$1.$2.txt | tr '\n' ' ')" | tee -a $R/bard.txt
done; done
grep -h "per round:\|per token:" $R/err.6.*.txt
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
