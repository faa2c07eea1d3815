#!/bin/bash
# Issue 21 (decode at real depth) on the H200, one device call. Needs in .h200/ the stripped,
# xz-compressed release `sparsa` and, optionally, `examples/gemv_shapes` (gemv.xz) and the
# lib test binary (libtest.xz); in .gl/ the Vulkan loader debs (see the device README).
# Results go to $OUT (default benches/results/new), in a few files (the device returns few).
# 1. GEMVs of every GLM-5 matrix in isolation, per knob, and the cost of a dispatch
#    (examples/gemv_shapes.rs) -> gemv.txt.
# 2. The lib tests on the real driver -> libtest.txt; the built-in model's greedy ids.
# 3. Full-depth GLM-5 shape (78 layers, 16 experts, q4): decode at 4096 with each knob
#    (bench_profiled.txt has the per-kernel table), then DeepSeek-V3.2 (61 layers) -> ds.txt.
set -u
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
for b in sparsa gemv libtest; do [ -f .h200/$b.xz ] && { xz -dc .h200/$b.xz > /tmp/$b; chmod +x /tmp/$b; }; done
S=/tmp/sparsa; D=/tmp/g5; SUM=$OUT/summary.txt
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) > $OUT/synth.txt 2>&1 &
SYN=$!
$S devices >> $SUM 2>&1
if [ -x /tmp/gemv ]; then
  G() { # name, env...
    local name=$1; shift
    echo "== gemv $name: $*" >> $OUT/gemv.txt
    env "$@" timeout 120 /tmp/gemv ${FORMATS:-q4} 20 >> $OUT/gemv.txt 2>&1
  }
  FORMATS=q4,q8,bf16 G default
  G noxq SPARSA_GEMV_XQ=0
  grep -E "^==|all|dispatch chain" $OUT/gemv.txt >> $SUM
fi
# The built-in model's greedy tokens on this driver (compare with the same command on lavapipe).
$S generate --temperature 0 -n 48 --print-ids --prompt "KING RICHARD:" 2>/dev/null | tail -1 | sed 's/^/greedy ids: /' >> $SUM
[ -x /tmp/libtest ] && { timeout 200 /tmp/libtest --test-threads 4 > $OUT/libtest.txt 2>&1; grep "test result" $OUT/libtest.txt >> $SUM; }
wait $SYN; tail -3 $OUT/synth.txt >> $SUM
B() { # model, name, env...
  local m=$1 name=$2; shift 2
  echo "== bench $name: $*" >> $OUT/bench.txt
  env "$@" timeout 150 $S bench --model $m --context ${CTX:-4096} --decode 32 --prompt-len 0 ${PROFILE:---no-profile} >> $OUT/bench.txt 2>&1
}
# Knobs side by side with the default (BENCH_SET, space-separated names, picks them).
PROFILE=" " B $D profiled
for k in ${BENCH_SET:-default_128k noxq default}; do
  case $k in
    default) PROFILE="--no-profile --calibrate" B $D default ;;
    default_128k) CTX=131072 B $D default_128k ;;
    default_32k) CTX=32768 B $D default_32k ;;
    noxq) B $D noxq SPARSA_GEMV_XQ=0 ;;
    shared_dense) B $D shared_dense SPARSA_SHARED_ROUTED=0 ;;
    mla_hg4) B $D mla_hg4 SPARSA_MLA_HG=4 ;;
    mla_hg8) B $D mla_hg8 SPARSA_MLA_HG=8 ;;
    topk_wide) B $D topk_wide SPARSA_TOPK_WIDE_MIN=2048 ;;
    *=*) B $D "$k" "$k" ;; # any knob: NAME=VALUE
  esac
done
rm -rf $D
if [ -z "${SKIP_DS:-}" ]; then
  ( time $S synth --like deepseek-v3.2 --layers 61 --experts 16 --format q4 --out /tmp/ds ) >> $OUT/synth.txt 2>&1
  PROFILE=" " B /tmp/ds ds_profiled
  rm -rf /tmp/ds
fi
grep -E "^== bench|^bench: decode|rror" $OUT/bench.txt >> $SUM
cat $SUM
