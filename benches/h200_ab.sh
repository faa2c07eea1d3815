#!/bin/bash
# Issue 21: decode knobs side by side on the full-depth GLM-5 q4 shape (zero weights, holes:
# no synth time), in alternating rounds, on cores 14-15, while llama.cpp builds on cores 0-13
# (BUILD=1: benches/h200_peer.sh BUILD_ONLY=1, leaving the build for the next call's peer run
# on the same warm machine). Then a profiled run of the default, the built-in model's greedy
# ids, and greedy ids of a random-weight 2-layer q4 synth under each knob (the knobs must not
# change tokens). Needs .h200/sparsa.xz and .gl/ (see h200_decode.sh); .h200/libtest.xz optional.
# Env: SETS (space-separated knob sets, "default" = none, else NAME=VALUE[,NAME=VALUE];
#      BIN=NAME runs .h200/NAME.xz instead of .h200/sparsa.xz, e.g. the previous build),
#      ROUNDS (2), CTX (4096), BUILD, LT_THREADS (the library tests' threads, 2).
set -u
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
for b in sparsa libtest; do [ -f .h200/$b.xz ] && { xz -dc .h200/$b.xz > /tmp/$b; chmod +x /tmp/$b; }; done
S=/tmp/sparsa; D=/tmp/g5; SUM=$OUT/summary.txt; T0=$(date +%s)
note() { echo "[$(($(date +%s) - T0))s] $*" | tee -a $SUM; }
if [ -n "${BUILD:-}" ]; then
  mkdir -p $OUT/build
  OUT=$OUT/build BUILD_ONLY=1 SKIP_BUILD_PACK=1 JOBS=14 BUDGET_S=590 \
    taskset -c 0-13 bash benches/h200_peer.sh > $OUT/build/peer.log 2>&1 &
  BPID=$!
fi
PIN="taskset -c 14,15"
# The library's tests on this driver first (on every core unless llama.cpp builds beside).
LT_PIN=; [ -n "${BUILD:-}" ] && LT_PIN=$PIN
[ -x /tmp/libtest ] && { timeout 200 $LT_PIN /tmp/libtest --test-threads ${LT_THREADS:-2} > $OUT/libtest.txt 2>&1; note "libtest: $(grep 'test result' $OUT/libtest.txt)"; }
$S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D > /dev/null 2>&1
B() { # name, comma-separated NAME=VALUE knobs or "default", extra bench flags...
  local name=$1 knobs=$2; shift 2
  local e=() bin=$S; [ "$knobs" != default ] && IFS=, read -ra e <<< "$knobs"
  # BIN=NAME in a set: the binary carried as .h200/NAME.xz instead of sparsa.
  for v in "${e[@]}"; do [[ $v == BIN=* ]] && bin=/tmp/${v#BIN=}; done
  [ -x "$bin" ] || { xz -dc .h200/${bin#/tmp/}.xz > $bin; chmod +x $bin; }
  echo "== bench $name: ${e[*]:-}" >> $OUT/bench.txt
  env "${e[@]}" timeout 150 $PIN $bin bench --model $D --context ${CTX:-4096} --decode 32 --prompt-len 0 "$@" >> $OUT/bench.txt 2>&1
  note "$name: $(grep -E '^bench: decode' $OUT/bench.txt | tail -1)"
}
for r in $(seq ${ROUNDS:-2}); do
  for k in ${SETS:-default}; do B "r$r $k" $k --no-profile; done
done
B "profiled default" default
$S generate --temperature 0 -n 48 --print-ids --prompt "KING RICHARD:" 2>/dev/null | tail -1 | sed 's/^/built-in greedy ids: /' >> $SUM
rm -rf $D
$S synth --like glm-5 --layers 2 --experts 16 --format q4 --out /tmp/small > /dev/null 2>&1
for k in default ${SETS:-}; do
  e=(); [ "$k" != default ] && IFS=, read -ra e <<< "$k"
  env "${e[@]}" $S generate --model /tmp/small --temperature 0 -n 24 --print-ids --prompt "The" 2>/dev/null | tail -1 | sed "s/^/2-layer q4 greedy ($k): /" >> $SUM
done
if [ -n "${BUILD:-}" ]; then wait $BPID; note "llama.cpp build: $(grep -E 'build: rc' $OUT/build/summary.txt)"; fi
cat $SUM
