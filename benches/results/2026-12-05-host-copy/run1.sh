#!/bin/bash
# Issue 22 at full depth: hybrid decode with the experts' host copy (--expert-host-copy, the
# GPU copies a share of each layer's misses from host memory while the CPU computes the
# others) against without it, alternated; then every miss uploaded (--cpu-experts off) with
# and without it, whole-layer placement with it, and 14 / 13 executor threads (15 workers,
# the pool's leader and the host's thread spin on 16 cores by default). Carry .gl and .h200 (the bundle, and
# .h200/sparsa.xz: the build with the host copy, which replaces the bundle's sparsa).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o1; mkdir -p $OUT
save() { tar -C $OUT -cJf $R/raw1.tar.xz . ; }
left() { echo $((${LIMIT:-580} - SECONDS)); }
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0"
timeout 90 $S $B --decode 4 --expert-host-copy off > /dev/null 2>&1
echo "[$SECONDS s]"
for v in hc nohc t14 offhc t13 layershc hc nohc offnohc; do
  [ $(left) -gt 70 ] || break
  case $v in
    hc) a="--cpu-experts on" ;;
    nohc) a="--cpu-experts on --expert-host-copy off" ;;
    offhc) a="--cpu-experts off" ;;
    offnohc) a="--cpu-experts off --expert-host-copy off" ;;
    layershc) a="--cpu-experts on --expert-placement layers" ;;
    t14) a="--cpu-experts on --cpu-threads 14" ;;
    t13) a="--cpu-experts on --cpu-threads 13" ;;
  esac
  f=$OUT/hy-$v-$SECONDS.txt
  RUST_LOG=sparsa::model=info timeout 110 $S $B $a > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "host copy|ms/token median|routing waits|a token's time|CPU experts: RAM|host→GPU|together|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks)/\1\2/' | cut -c1-420
  save
done
[ -n "${KEEP_SYNTH:-}" ] || rm -rf $D
echo "[$SECONDS s]"
