#!/bin/bash
# The last minutes of device time: this build's default hybrid decode at full depth under
# 24 GiB, uniform routing, as many runs as fit (no warm-up run: the synth just wrote the files,
# so they are in the page cache). Carry .gl and .h200 (sparsa.xz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o3; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw3.tar.xz . ; }
left() { echo $((${LIMIT:-280} - SECONDS)); }
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --gpu-memory 24GiB --expert-routing zipf:0"
for v in new new new new; do
  [ $(left) -gt 42 ] || break
  f=$OUT/$v-$SECONDS.txt
  env RUST_LOG=sparsa::model=info timeout 60 $S $B --decode 32 --prompt-len 0 --no-profile --cpu-experts on > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "copied to the GPU|ms/token median|routing waits|a token's time|together|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks)/\1\2/; s/.*(copied to the GPU.*)/\1/' | cut -c1-300
  save
done
rm -rf $D
echo "[$SECONDS s]"
