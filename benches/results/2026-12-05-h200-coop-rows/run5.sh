#!/bin/bash
# run4.sh cut to the device time left (about 5 minutes): the same question (where a hybrid
# layer's routing wait goes) on a 20-layer GLM-5 q4 synth (17 MoE layers; ~45 % of its
# experts resident at 6 GiB), profiled (GPU timestamps per dispatch), hybrid and resident.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o5; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw5.tar.xz . ; }
D=/tmp/m20
( time timeout 60 $S synth --like glm-5 --layers 20 --experts 16 --format q4 --out $D > /dev/null 2>&1 ) 2>&1 | grep real
B="bench --model $D --context 4096 --prompt-len 0 --decode 8"
for g in 6GiB 7GiB 8GiB; do
  timeout 60 $S $B --gpu-memory $g --expert-routing zipf:0 --cpu-experts on > $OUT/hybrid.txt 2>&1 && break
done
grep -E "ms/token median of|routing waits|a token.s time|hit rate|host→GPU|together|CPU experts|rror" $OUT/hybrid.txt | cut -c1-220; save
echo "[$SECONDS s]"
timeout 40 $S $B > $OUT/resident.txt 2>&1
grep -E "ms/token median of" $OUT/resident.txt | cut -c1-120; save
echo "[$SECONDS s]"
