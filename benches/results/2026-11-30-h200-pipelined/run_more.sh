#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; for f in sparsa gemv_shapes; do xz -dc .h200/$f.xz > /tmp/b/$f; done; chmod +x /tmp/b/*
S=/tmp/b/sparsa
for m in "glm-5 q8 g5q8" "glm-5 bf16 g5bf"; do set -- $m; [ -d /tmp/$3 ] || $S synth --like $1 --layers 4 --experts 16 --format $2 --out /tmp/$3 2>&1 | tail -1; done
mkdir -p /tmp/o
for m in g5q8 g5bf; do timeout 100 $S bench --model /tmp/$m --calibrate --context 4096 --prompt-len 512 --decode 32 > /tmp/o/$m.txt 2>/dev/null; grep -h "calibration\|^decode at\|GPU time" /tmp/o/$m.txt; done
/tmp/b/gemv_shapes q4,q8,bf16 20 > /tmp/o/gemv_shapes.txt 2>&1; cat /tmp/o/gemv_shapes.txt
cd /tmp/o && tar czf $OUT/more.tgz *.txt
