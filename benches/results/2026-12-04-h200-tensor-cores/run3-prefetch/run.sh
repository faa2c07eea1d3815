#!/bin/bash
# Issue 20: the q4 staging with three K-tiles' loads in flight (default, SPARSA_COOP_Q4=0)
# against element pairs (=2, numerically the same B tile: outputs must be identical), on a
# 4-layer GLM-5 q4 synth: greedy tokens after a 300-token prefill, then prefill speed.
set -u
. benches/h200_setup.sh
D=/tmp/m4
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > /dev/null 2>&1
T=$(seq -s, 11 310)
for m in 2 0; do
  SPARSA_COOP_Q4=$m timeout 60 $S generate --model $D --tokens $T --temperature 0 --max-tokens 12 > $OUT/gen$m.txt 2>$OUT/gen$m.err
  echo "gen mode $m rc=$?: $(tr '\n' ' ' < $OUT/gen$m.txt | cut -c1-200)"
done
cmp $OUT/gen0.txt $OUT/gen2.txt && echo "greedy outputs identical"
for rep in a b; do for m in 0 2; do
  echo "== SPARSA_COOP_Q4=$m ($rep)"
  SPARSA_COOP_Q4=$m timeout 100 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048,4096 --no-profile > $OUT/q4mode$m-$rep.txt 2>&1
  grep -E "^prefill|rror" $OUT/q4mode$m-$rep.txt | head -3
done; done
rm -rf $D
