#!/bin/bash
# 2026-12-06 (seventh session), first call, bundle of the commit in .h200/BUILT_FROM, with 3c2e5dd's binary beside it
# (sparsa-3c2e5dd; run with SPARSA_SUBMIT_EVERY=0 it records GPU rounds as e10549d does):
# issue 25's built-in target, where a round's time goes.
#   1. The pipelines-by-numbers lib test on the real driver.
#   2. The built-in model, 1,000 greedy tokens (--ignore-eos), alternated twice: no drafts
#      and --draft 3 with GPU rounds two and three deep (f5f997d), no drafts and --draft 3
#      (3c2e5dd). Each run's text hashed: greedy output must be the same in all.
#   3. --draft 3 with the pipeline cache's compile log (RUST_LOG): what compiles during
#      decoding; 40 tokens with every dispatch logged: a round's dispatches on this driver.
#   4. `bench --verify 3` on the built-in model.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest
R=/tmp/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
tail -1 $R/gpu.txt
timeout 120 /tmp/libtest gpu::pools::pipelines --test-threads=2 > $R/lib.txt 2>&1
echo "lib tests pipelines (rc $?): $(grep 'test result' $R/lib.txt)"
M=models/sparsa-bard-12m
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
for r in 1 2; do
  for v in "sparsa 0 -" "sparsa 3 -" "sparsa 3 SPARSA_ROUND_DEPTH=3" "sparsa-3c2e5dd 0 -" "sparsa-3c2e5dd 3 SPARSA_SUBMIT_EVERY=0"; do
    set -- $v; e=""; [ "$3" = - ] || e="$3"
    echo "== $r $1 --draft $2 $3" >> $R/bard.txt
    env $e timeout 60 /tmp/$1 generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $2 -v > $R/text.txt 2> $R/err.txt
    echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
    grep -E "tok/s|drafts:|host ms|rror" $R/err.txt >> $R/bard.txt
  done
done
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | paste - - - - | cut -c1-200
RUST_LOG=sparsa::gpu::pools=debug timeout 60 $S generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft 3 -v > /dev/null 2> $R/compiles.txt
grep -c compiled $R/compiles.txt; grep -E "compiled|tok/s" $R/compiles.txt | tail -12 | cut -c1-160
RUST_LOG=sparsa::gpu::recorder=trace timeout 60 $S generate -m $M -p "$P" -n 40 --ignore-eos --temperature 0 --draft 3 > /dev/null 2> $R/trace.txt
grep -c dispatch $R/trace.txt; xz -9 $R/trace.txt
timeout 60 $S bench --model $M --context 200 --decode 16 --prompt-len 0 --verify 3 > $R/verify.txt 2>&1
grep -hE "^bench: (verify|draft|decode)|rror" $R/verify.txt | cut -c1-200
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
