#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; for f in sparsa lib_tests; do xz -dc .h200/$f.xz > /tmp/b/$f; done; chmod +x /tmp/b/*
S=/tmp/b/sparsa
( for m in "glm-5 q4 g5q4" "glm-5 bf16 g5bf"; do set -- $m; $S synth --like $1 --layers 4 --experts 16 --format $2 --out /tmp/$3 2>&1 | tail -1; done ) &
mkdir -p /tmp/o
RUST_LOG=warn timeout 200 /tmp/b/lib_tests 2>&1 | grep "test result\|FAILED\|panicked" -A3 | head -30 | tee /tmp/o/lib_all.txt
wait
$S bench --model /tmp/g5q4 --calibrate --context 4096,131072 --prompt-len 512 --decode 32 --json /tmp/o/g5q4_absorb.json > /tmp/o/g5q4_absorb.txt 2>&1; grep "^bench: decode\|calibration" /tmp/o/g5q4_absorb.txt; grep "absorb_q" /tmp/o/g5q4_absorb.txt
$S bench --model /tmp/g5bf --context 4096 --prompt-len 512 --decode 32 > /tmp/o/g5bf_absorb.txt 2>&1; grep "^bench: decode" /tmp/o/g5bf_absorb.txt; grep "absorb_q" /tmp/o/g5bf_absorb.txt
cd /tmp/o && tar czf $OUT/r21.tgz *
