#!/bin/bash
# 2026-12-06 (seventh session), second call, bundle of the commit in .h200/BUILT_FROM:
# issue 25's built-in target with every cut of this session. The built-in model, 2,000
# greedy tokens (--ignore-eos), no drafts against --draft 3 alternated four times (run1's
# 1,000-token runs, 0.5 s each, varied by ±5 % between passes), then --draft 2 and
# --draft 3 with SPARSA_ROUND_DEPTH=3 once; each run's text hashed. `bench --verify 3`.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
tail -1 $R/gpu.txt
M=models/sparsa-bard-12m
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
one() {
  local r=$1 k=$2 e=$3
  echo "== $r --draft $k $e" >> $R/bard.txt
  env $( [ "$e" = - ] || echo $e ) timeout 60 $S generate -m $M -p "$P" -n 2000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
  echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
  grep -E "tok/s|drafts:|host ms|rror" $R/err.txt >> $R/bard.txt
}
for r in 1 2 3 4; do one $r 0 -; one $r 3 -; done
one 5 2 -; one 5 3 SPARSA_ROUND_DEPTH=3; one 5 0 -; one 5 3 -
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | paste - - - - | cut -c1-200
timeout 60 $S bench --model $M --context 1000 --decode 32 --prompt-len 0 --verify 3 > $R/verify.txt 2>&1
grep -hE "^bench: (verify|draft|decode)|rror" $R/verify.txt | cut -c1-200
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
