#!/bin/bash
# Issue 22: a hybrid round's CPU experts run on the executor's threads while the host records
# the combine and the next layer (SPARSA_CPU_OVERLAP=1, the default) against the host waiting
# for them first (=0), one binary, alternated; the offload tests and the goldens (hybrid
# rounds included) on the real driver.
set -u
. benches/h200_setup.sh
# The test binaries name this repository's root and the sparsa binary by the build machine's
# paths.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
mkdir -p target/release && cp $S target/release/sparsa
timeout 200 /tmp/offload --test-threads=4 > $OUT/offload.txt 2>&1
echo "offload tests (rc $?): $(grep 'test result' $OUT/offload.txt)"
timeout 300 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.txt 2>&1
echo "goldens (rc $?): $(grep 'test result' $OUT/goldens.txt)"
grep -iE "hybrid|cpu" $OUT/goldens.txt | cut -c1-200 | head -8
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
for rep in a b c; do
  for o in 1 0; do
    echo "== overlap $o ($rep)"
    SPARSA_CPU_OVERLAP=$o timeout 150 $S $B > $OUT/hy-$o-$rep.txt 2>&1
    grep -E "decode at|CPU experts|routing|host ms|rror" $OUT/hy-$o-$rep.txt | cut -c1-300
  done
done
rm -rf $D
