#!/bin/bash
# Issue 25 on the H200, one device call: a full-depth zero-weight GLM-5 q4 synth with its MTP
# layer (`synth --mtp`); `sparsa bench --verify` at 4K and 32K (a forward of k + 1 positions
# with every row's logits, and one MTP draft step, each against a single synchronous decode
# step); then `generate` greedy with --draft 0 and --draft K (zero weights: every logit is
# 0, so the main model and the drafter both pick token 0 and every draft is accepted: the
# best case, what the round costs when all k drafts land).
# Needs .h200/sparsa.xz and .gl/ (the Vulkan loader debs). Results: $OUT/mtp.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
T=$OUT/mtp.txt
D=/tmp/m
like=${LIKE:-glm-5}; layers=78; [ "$like" = deepseek-v3.2 ] && layers=61
echo "== $like q4 experts 16 layers $layers zeros, MTP layer" >> $T
( time $S synth --like $like --layers $layers --experts 16 --format q4 --zeros --mtp --out $D ) 2>&1 | tail -4 >> $T
# SETS: knob sets (NAME=VALUE[,NAME=VALUE]) the bench runs under, one after another.
for set in ${SETS:-default}; do
  echo "== bench $set" >> $T
  env $( [ "$set" = default ] || echo "$set" | tr , ' ' ) timeout 240 $S bench --model $D --context ${CTX:-4096,32768} --decode 16 --prompt-len 0 ${PROFILE:---no-profile} --verify ${VERIFY:-1,2,3,4,7} >> $T 2>&1
done
P=$(seq -s, 1 64)
for k in 0 ${DRAFTS:-1 3 5}; do
  echo "== generate --draft $k" >> $T
  timeout 120 $S generate --model $D --tokens $P --max-tokens 256 --ignore-eos --temperature 0 -v --draft $k 2>&1 | grep -E "tok/s|drafts|rror" >> $T
done
rm -rf $D
grep -E "^==|^bench: (verify|draft|decode)|decode .* tok/s|drafts:|rror" $T
true
