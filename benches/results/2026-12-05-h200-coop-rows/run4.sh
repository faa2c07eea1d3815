#!/bin/bash
# 2026-12-05 midday, last call of the session (same carry): where a hybrid layer's routing
# wait goes. run3 measured 0.63-0.65 ms a wait (77 a token) against 0.033 ms for an empty
# round trip. Profiled (GPU timestamps around each dispatch) full-depth hybrid decode under
# 24 GiB, and the same synth resident, so the kernels of a layer's chain (combine, attention,
# router) can be compared between the two.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o4; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw4.tar.xz . ; }
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --prompt-len 0"
timeout 60 $S $B --decode 8 > $OUT/resident.txt 2>&1
grep -E "ms/token median of" $OUT/resident.txt | cut -c1-120; save
echo "[$SECONDS s]"
timeout 90 $S $B --decode 8 --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on > $OUT/hybrid.txt 2>&1
grep -E "ms/token median of|routing waits|a token's time" $OUT/hybrid.txt | cut -c1-200; save
echo "[$SECONDS s]"
rm -rf $D
