#!/bin/bash
# The lib tests' hang (run2 and the first pass of run4's predecessor: 4 threads, driver shader
# cache cold, no GPU test finished): with one device opened and one pipeline compiled at a
# time, three passes each with a fresh (cold) driver shader cache. Then, as time allows,
# issue 22's hybrid decode at the committed code (not measured on the H200 since a12ef77).
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest
for i in 1 2 3; do
  C=$(mktemp -d); export __GL_SHADER_DISK_CACHE_PATH=$C
  s=$SECONDS
  timeout 60 /tmp/libtest kernels:: bench:: gpu:: --test-threads=4 > $OUT/lib4.$i.txt 2>&1
  echo "pass $i: rc $? in $((SECONDS - s)) s: $(grep 'test result' $OUT/lib4.$i.txt) ok=$(grep -c ' ok$' $OUT/lib4.$i.txt)"
done
unset __GL_SHADER_DISK_CACHE_PATH
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1 ) 2>&1 | grep real
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
for rep in a b; do
  echo "== hybrid ($rep)"
  timeout 100 $S $B > $OUT/hy-$rep.txt 2>&1
  grep -E "decode at|CPU experts|routing|stalled|a token|rror" $OUT/hy-$rep.txt | cut -c1-300
done
rm -rf $D
