#!/bin/bash
# Issue 25 on the H200: the built-in model with its trained MTP layer (training/mtp.py),
# greedy decode with --draft 0..3 on held-out-style prompts: decode tok/s and the drafts line.
# Needs .h200/sparsa.xz and .gl/; $MODEL: a model with an MTP layer (default the built-in
# one). Results: $OUT/bard_mtp.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
T=$OUT/bard_mtp.txt
M=${MODEL:-models/sparsa-bard-12m}
N=${TOKENS:-256}
prompts=(
  $'ROMEO.\nBut soft, what light through yonder window breaks?\n'
  $'Of Man\'s first disobedience, and the fruit\n'
  $'Ham.\nTo be, or not to be, that is the question:\n'
  $'Bru.\nFriends, Romans, countrymen, lend me your ears;\n'
)
for round in 1 2; do
  for k in ${DRAFTS:-0 1 2 3 4}; do
    for p in "${prompts[@]}"; do
      echo "== round $round draft $k: ${p%%$'\n'*}" >> $T
      timeout 60 $S generate -m $M -p "$p" -n $N --ignore-eos --temperature 0 --draft $k -v 2>&1 \
        | grep -E "tok/s|drafts:|rror" >> $T
    done
  done
done
grep -E "^==|decode|drafts:|rror" $T
true
