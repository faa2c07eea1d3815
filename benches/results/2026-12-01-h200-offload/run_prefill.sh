#!/bin/bash
# Second device run: prefill under the 25 % budget, and the default LFU decay (0.99).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
R=$OUT/r; mkdir -p $R
SP=/tmp/sparsa; xz -dc .h200/sparsa.xz > $SP; chmod +x $SP
D=/tmp/g5q4
[ -d $D ] || $SP synth --like glm-5 --layers 4 --format q4 --out $D > $R/synth.txt 2>&1
B25=7397239852
P="$SP bench --model $D --context 4096 --decode 8 --prompt-len 512,2048 --no-profile"
RUST_LOG=info timeout 250 $P --gpu-memory 130GiB > $R/prefill_resident.txt 2>&1
RUST_LOG=info timeout 250 $P --gpu-memory $B25 > $R/prefill_b25_uniform.txt 2>&1
RUST_LOG=info timeout 200 $SP bench --model $D --context 4096 --decode 64 --prompt-len 0 --no-profile --gpu-memory $B25 --expert-routing zipf:1.0 > $R/b25_zipf1_lfu099.txt 2>&1
cd $OUT && tar czf r.tgz r && rm -rf r
