#!/bin/bash
# Issue 21 (decode at real depth) on the H200, one device call. Needs in .h200/ the stripped,
# xz-compressed release `sparsa`, `examples/gemv_shapes` (gemv.xz) and, optionally, the lib
# test binary (libtest.xz); in .gl/ the Vulkan loader debs (see the device README). Results
# go to $OUT (default benches/results/new).
# 1. GEMVs of every GLM-5 matrix in isolation: the integer-dot q4 GEMV with x quantized by
#    each workgroup vs once beforehand (SPARSA_GEMV_XQ), unrolled loads, lanes per row; q8 and
#    bf16 as they are; the cost of a dispatch (examples/gemv_shapes.rs).
# 2. The lib tests on the real driver.
# 3. Full-depth GLM-5 shape (78 layers, 16 experts, q4): decode at 4096 with each knob.
set -u
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
for b in sparsa gemv libtest; do [ -f .h200/$b.xz ] && { xz -dc .h200/$b.xz > /tmp/$b; chmod +x /tmp/$b; }; done
S=/tmp/sparsa; D=/tmp/g5
[ -d $D ] || ( ( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) > $OUT/synth.txt 2>&1 ) &
SYN=$!
$S devices > $OUT/devices.txt 2>&1
G() { # name, env...
  local name=$1; shift
  env "$@" timeout 120 /tmp/gemv ${FORMATS:-q4} 20 > $OUT/gemv_$name.txt 2>&1
  grep -E "all|dispatch chain" $OUT/gemv_$name.txt | sed "s/^/$name: /"
}
FORMATS=q4,q8,bf16 G base SPARSA_GEMV_XQ=0
G xq SPARSA_GEMV_XQ=1
G xq_unroll2 SPARSA_GEMV_XQ=1 SPARSA_GEMV_UNROLL=2
G xq_tpr32 SPARSA_GEMV_XQ=1 SPARSA_GEMV_TPR=32
G xq_tpr16 SPARSA_GEMV_XQ=1 SPARSA_GEMV_TPR=16
G xq_tpr16_unroll2 SPARSA_GEMV_XQ=1 SPARSA_GEMV_TPR=16 SPARSA_GEMV_UNROLL=2
G nozero SPARSA_GEMV_XQ=0 SPARSA_ZERO_WORKGROUP_MEMORY=0
[ -x /tmp/libtest ] && { timeout 150 /tmp/libtest --test-threads 4 > $OUT/libtest.txt 2>&1; grep "test result" $OUT/libtest.txt; }
wait $SYN; tail -3 $OUT/synth.txt
B() { # name, env...
  local name=$1; shift
  env "$@" timeout 150 $S bench --model $D --context 4096 --decode 32 --prompt-len 0 ${PROFILE:---no-profile} > $OUT/bench_$name.txt 2>&1
  grep -E "^decode at|rror" $OUT/bench_$name.txt | head -3 | sed "s/^/$name: /"
}
PROFILE=" " B xq_profiled
B xq
B noxq SPARSA_GEMV_XQ=0
B xq_nozero SPARSA_ZERO_WORKGROUP_MEMORY=0
B xq_nobounds SPARSA_SHADER_BOUNDS_CHECKS=0
B xq_unroll2 SPARSA_GEMV_UNROLL=2
B xq_tpr16 SPARSA_GEMV_TPR=16
[ -n "${KEEP:-}" ] || rm -rf $D
