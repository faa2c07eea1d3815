#!/bin/bash
# 2026-12-06 (sixth session), first call, bundle of 3c2e5dd: greedy speculative rounds queued
# on the GPU (issue 25's built-in target).
#   1. The spec kernels' and the samplers' lib tests on the real driver.
#   2. The built-in model, 1,000 greedy tokens (--ignore-eos), alternated twice: no
#      drafts; --draft 3 with GPU rounds (default), with the host's rounds
#      (SPARSA_GPU_ROUNDS=0) and with GPU rounds one deep (SPARSA_ROUND_DEPTH=1); --draft 2,
#      4. The output text of each is hashed: greedy output must be the same in all.
#   3. `bench --verify 3` on the built-in model (a step, a verification, a draft step).
# Every output in one archive ($OUT/run1.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest
R=/tmp/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
cat $R/gpu.txt | tail -1
timeout 150 /tmp/libtest kernels::spec:: --test-threads=2 > $R/lib.txt 2>&1
echo "lib tests spec (rc $?): $(grep 'test result' $R/lib.txt)"
M=models/sparsa-bard-12m
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
for r in 1 2; do
  for v in "0 -" "3 -" "3 SPARSA_GPU_ROUNDS=0" "3 SPARSA_ROUND_DEPTH=1" "2 -" "4 -"; do
    set -- $v; e=""; [ "$2" = - ] || e="$2"
    echo "== $r --draft $1 $2" >> $R/bard.txt
    env $e timeout 60 $S generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $1 -v > $R/text.txt 2> $R/err.txt
    echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
    grep -E "tok/s|drafts:|host ms|rror" $R/err.txt >> $R/bard.txt
  done
done
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | paste - - - - | cut -c1-220
timeout 60 $S bench --model $M --context 200 --decode 16 --prompt-len 0 --verify 3 > $R/verify.txt 2>&1
grep -hE "^bench: (verify|draft|decode)|rror" $R/verify.txt | cut -c1-200
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
