#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; xz -dc .h200/sparsa.xz > /tmp/b/sparsa; chmod +x /tmp/b/*
S=/tmp/b/sparsa
$S synth --like glm-5 --layers 4 --experts 16 --format q4 --out /tmp/g5q4 2>&1 | tail -1
for tc in 1 0; do
  echo "== SPARSA_TENSOR_CORES=$tc"
  SPARSA_TENSOR_CORES=$tc timeout 250 $S bench --model /tmp/g5q4 --prompt-len 131072 --context 131072 --decode 4 --no-profile > $OUT/g5q4_128k_tc$tc.txt 2>&1; echo "rc $?"
  grep -v "^bench" $OUT/g5q4_128k_tc$tc.txt | head -8
done
