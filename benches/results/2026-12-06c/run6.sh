#!/bin/bash
# 2026-12-06 (third session), last device call: the routed experts' rows kernel's settings
# with the subgroup-shuffle reduction now its default (578bd7c), at full depth (GLM-5 q4
# synth, 78 layers, 16 experts, context 4,096, 8 sequences): slots a pass
# (SPARSA_EXPERT_BATCH 2 / 8 against 4) and the early load of the next word position
# (SPARSA_ROWS_UNROLL=1 against 2), tuned in 2026-12-04 with the tree reduction. Alternated
# while the call lasts (LIMIT, default 280 s). Every output in one archive ($OUT/run6.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run6; mkdir -p $R
D=/tmp/m
timeout 150 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-280} - SECONDS)); }
for v in auto "SPARSA_EXPERT_BATCH=8" "SPARSA_EXPERT_BATCH=2" "SPARSA_ROWS_UNROLL=1" auto "SPARSA_EXPERT_BATCH=8" "SPARSA_EXPERT_BATCH=2" "SPARSA_ROWS_UNROLL=1"; do
  [ $(left) -gt 30 ] || break
  e=""; [ "$v" = auto ] || e="$v"
  f="$R/bt.${v// /+}.$SECONDS.txt"
  env $e timeout 25 $S bench --model $D --context 4096 --decode 8 --batch 8 --prompt-len 0 --no-profile > "$f" 2>&1
  echo "== $v: $(grep -hE '^bench: batched|rror' "$f" | cut -c1-100)"
done
rm -rf $D
tar czf $OUT/run6.tgz -C $R .
echo "[$SECONDS s]"
