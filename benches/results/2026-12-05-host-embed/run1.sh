#!/bin/bash
# Hybrid decode at full depth under 24 GiB: this build's default (the experts' host copy, the
# embedding table in host memory, each hybrid round's CPU part started before the GPU's) against
# the same build with --host-embeddings off and against the build before both (cf4937e,
# sparsa_old), alternated. Carry .gl and .h200 (sparsa.xz, sparsa_old.xz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o1; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw1.tar.xz . ; }
left() { echo $((${LIMIT:-575} - SECONDS)); }
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --gpu-memory 24GiB --expert-routing zipf:0"
timeout 90 $S $B --decode 2 --prompt-len 0 --no-profile > /dev/null 2>&1
echo "[$SECONDS s]"
for v in new old noemb new old noemb; do
  [ $(left) -gt 62 ] || break
  a="--decode 32 --prompt-len 0 --no-profile --cpu-experts on"; b=$S
  case $v in
    noemb) a="$a --host-embeddings off" ;;
    old) b=/tmp/sparsa_old ;;
  esac
  f=$OUT/$v-$SECONDS.txt
  env RUST_LOG=sparsa::model=info timeout 100 $b $B $a > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "GPU memory plan|ms/token median|routing waits|a token's time|together|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks)/\1\2/; s/.*(routed experts [0-9]+ of [0-9]+).*/\1/' | cut -c1-330
  save
done
rm -rf $D
echo "[$SECONDS s]"
