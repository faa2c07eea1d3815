#!/bin/bash
# Issue 18 (architecture, no behaviour change) on the H200, one device call: the binary
# before the change (f37bd43, .h200/old.xz) and after it (.h200/new.xz), stripped release
# builds. 1. benches/bitwise.sh: every test model's logits / greedy / sampled / streamed
# experts, old against new, on the real driver (tensor-core prefill GEMMs). 2. Decode at the
# real depth: synth GLM-5 shape, 78 layers, 16 experts, q4 (38 GB), then `bench` with the two
# binaries alternately (old, new, old, new), context 4096, 64 decode steps each.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
for b in old new; do xz -dc .h200/$b.xz > /tmp/$b; chmod +x /tmp/$b; done
/tmp/new devices > $OUT/devices.txt 2>&1
timeout 150 benches/bitwise.sh /tmp/old /tmp/new tests/data /tmp/bw > $OUT/bitwise.txt 2>&1; echo "rc=$?" >> $OUT/bitwise.txt
D=/tmp/g5
( time /tmp/new synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) > $OUT/synth.txt 2>&1
for i in 1 2; do for b in old new; do
  timeout 120 /tmp/$b bench --model $D --context 4096 --decode 64 --prompt-len 0 --no-profile > $OUT/bench_${b}_$i.txt 2>&1
done; done
rm -rf $D
grep -h "decode at context" $OUT/bench_*.txt
