#!/bin/bash
# Issue 20: the tile with K-steps of 64 and x in 16-byte loads where aligned (coop_x4.wgsl),
# element loads elsewhere (coop_x1.wgsl). Lib tests (kernels::) and the transformers goldens
# on tensor cores; the goldens again with x as one f16 value (SPARSA_COOP_X_F16=1); then
# gemm_shapes, the previous tile (gemm_shapes_old, built from 713f7a6) and this one
# alternated, and this one with X_F16=1 and without naga's bounds clamps
# (SPARSA_COOP_UNCHECKED=1: buffers, =2: buffers and workgroup arrays).
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for n in libtest golden gemm_shapes gemm_shapes_old; do xz -dc .h200/$n.xz > /tmp/$n; chmod +x /tmp/$n; done
echo "== smoke: gemm_shapes q4 512 (stop if it hangs)"
timeout 60 /tmp/gemm_shapes q4 5 512 > $OUT/smoke.txt 2>&1 || { echo "rc=$?"; tail -5 $OUT/smoke.txt; exit 1; }
echo "== lib tests kernels:: bench:: gpu::"
timeout 200 /tmp/libtest kernels:: bench:: gpu:: --test-threads=4 > $OUT/libtests.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" $OUT/libtests.txt | head -8 | cut -c1-250
for v in 0 1; do
  echo "== X_F16=$v: goldens"
  SPARSA_COOP_X_F16=$v timeout 200 /tmp/golden --test-threads=2 --nocapture --skip quantize > /tmp/gd$v.txt 2>&1; echo "rc=$?"; grep -E "test result|max \|Δ|argmax|greedy" /tmp/gd$v.txt | head -30 | cut -c1-200
done
cat /tmp/gd0.txt /tmp/gd1.txt > $OUT/goldens.txt
run() { # label, binary, env...
  local l=$1 b=$2; shift 2
  echo "== $l"
  env "$@" timeout 100 /tmp/$b q4,bf16 5 512,2048 > /tmp/g.txt 2>&1; echo "rc=$?"
  sed "s/^/$l /" /tmp/g.txt >> $OUT/gemm_shapes.txt
  grep -E "^(q4|bf16): " /tmp/g.txt | grep -v matrix | awk '{printf "%s%s@%s=%s ", $1, $2, $(NF-6), $(NF-1)} END {print ""}'
}
run old1 gemm_shapes_old A=1
run new1 gemm_shapes A=1
run old2 gemm_shapes_old A=1
run new2 gemm_shapes A=1
run xf16 gemm_shapes SPARSA_COOP_X_F16=1
run unchecked1 gemm_shapes SPARSA_COOP_UNCHECKED=1
run unchecked2 gemm_shapes SPARSA_COOP_UNCHECKED=2
