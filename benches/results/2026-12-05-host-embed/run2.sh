#!/bin/bash
# Hybrid decode at full depth under 24 GiB, uniform routing: this build (the copies submitted
# on their own, the copy lane's fixed cost) against dd28d15 (sparsa_old: CPU part first, host
# embeddings), alternated three times; then prefill of 2,048 tokens with and without the
# embedding table in host memory. Carry .gl and .h200 (bundle.tar.xz: sparsa, sparsa_old).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o2; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw2.tar.xz . ; }
left() { echo $((${LIMIT:-575} - SECONDS)); }
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --gpu-memory 24GiB --expert-routing zipf:0"
timeout 90 $S $B --decode 2 --prompt-len 0 --no-profile > /dev/null 2>&1
echo "[$SECONDS s]"
for v in new mid new mid new mid pf-new pf-noemb; do
  [ $(left) -gt 62 ] || break
  a="--decode 32 --prompt-len 0 --no-profile --cpu-experts on"; b=$S
  case $v in
    mid) b=/tmp/sparsa_old ;;
    pf-new) a="--decode 0 --prompt-len 2048 --no-profile" ;;
    pf-noemb) a="--decode 0 --prompt-len 2048 --no-profile --host-embeddings off" ;;
  esac
  f=$OUT/$v-$SECONDS.txt
  env RUST_LOG=sparsa::model=info timeout 100 $b $B $a > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "host copy:|ms/token median|prefill.*tok/s|routing waits|a token's time|together|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks)/\1\2/; s/.*(copied to the GPU.*)/\1/' | cut -c1-330
  save
done
rm -rf $D
echo "[$SECONDS s]"
