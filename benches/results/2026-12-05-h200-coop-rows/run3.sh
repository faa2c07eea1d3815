#!/bin/bash
# Third call (same carry: .gl and .h200; the bundle adds sparsa-0f6b45f, the binary before the
# executor's own pool, and examples/cpu_experts): issue 22's hybrid decode at full depth with
# the CPU executor on experts/pool.rs (idle threads spin 5 ms, 15 threads by default) against
# rayon's pool (sparsa-0f6b45f), and the slots regrouped by whole layers (SPARSA_EXPERT_LAYERS=1:
# 45 offloaded layers instead of 77), alternated; then the pool's spin and thread count. Reuses
# run2's synth if it is still there (run2 with KEEP_SYNTH=1).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT; OUT=/tmp/o3; mkdir -p $OUT   # raw outputs: $R/raw3.tar.xz, after each run
save() { tar -C $OUT -cJf $R/raw3.tar.xz . ; }
chmod +x /tmp/sparsa-0f6b45f /tmp/cpu_experts
left() { echo $((${LIMIT:-580} - SECONDS)); }
lscpu | grep -E "^CPU\(s\)|Thread|Core|Model name" > $OUT/machine.txt
D=/tmp/m
[ -d $D ] || ( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
# The executor alone (GLM-5 q4 experts from RAM, a round of 5 after a 1 ms pause, as a layer's).
for v in "15 5000" "16 5000"; do
  set -- $v
  echo -n "executor alone, $1 threads, spin $2 us: "
  SPARSA_CE_THREADS=$1 SPARSA_CE_SPIN_US=$2 SPARSA_CE_PER_ROUND=5 SPARSA_CE_GAP_US=1000 timeout 40 /tmp/cpu_experts q4 32 100 2>/dev/null | sed 's/.* apart: //' | tee -a $OUT/executor.txt
done
# The first run after a synth is slow (page cache write-back): a short one to discard.
timeout 90 $S $B --decode 4 > /dev/null 2>&1
echo "[$SECONDS s]"
for v in old new layers new old layers spin0 t16; do
  [ $(left) -gt 75 ] || break
  case $v in
    old) cmd="/tmp/sparsa-0f6b45f $B" ;;
    new) cmd="$S $B" ;;
    layers) cmd="env SPARSA_EXPERT_LAYERS=1 $S $B" ;;
    spin0) cmd="env SPARSA_CPU_SPIN_US=0 $S $B" ;;
    t16) cmd="$S $B --cpu-threads 16" ;;
  esac
  f=$OUT/hy-$v-$SECONDS.txt
  timeout 100 $cmd > $f 2>&1
  echo "== $v [$SECONDS s]"
  grep -E "ms/token median|routing waits|a token's time|CPU experts: RAM|hit rate|rror" $f | sed -E 's/(hit rate [^,]*).*(, [0-9]+ readbacks).*/\1\2/' | cut -c1-330
  save
done
rm -rf $D
echo "[$SECONDS s]"
