#!/bin/bash
# Second call: the host copy again (its rate probe now best of seven over a layer's experts),
# against none, alternated; the copies' share of the misses set by hand (SPARSA_HOST_COPY_SHARE
# 30 and 50 %) beside the measured split; then a 2,048-token prefill under the budget with and
# without the host copy (prefill chunks upload their misses). Carry .gl and .h200 (sparsa.xz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o2; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw2.tar.xz . ; }
left() { echo $((${LIMIT:-560} - SECONDS)); }
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --gpu-memory 24GiB --expert-routing zipf:0"
timeout 90 $S $B --decode 4 --prompt-len 0 --no-profile --expert-host-copy off > /dev/null 2>&1
echo "[$SECONDS s]"
for v in hc nohc s50 hc s30 nohc pf-hc pf-nohc; do
  [ $(left) -gt 70 ] || break
  a="--decode 32 --prompt-len 0 --no-profile --cpu-experts on"; e=""
  case $v in
    nohc) a="$a --expert-host-copy off" ;;
    s50) e="SPARSA_HOST_COPY_SHARE=50" ;;
    s30) e="SPARSA_HOST_COPY_SHARE=30" ;;
    pf-hc) a="--decode 0 --prompt-len 2048 --no-profile" ;;
    pf-nohc) a="--decode 0 --prompt-len 2048 --no-profile --expert-host-copy off" ;;
  esac
  f=$OUT/$v-$SECONDS.txt
  env RUST_LOG=sparsa::model=info $e timeout 120 $S $B $a > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "host copy:|ms/token median|prefill.*tok/s|routing waits|a token's time|together|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks)/\1\2/' | cut -c1-400
  save
done
rm -rf $D
echo "[$SECONDS s]"
