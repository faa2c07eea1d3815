#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; for f in sparsa lib_tests; do xz -dc .h200/$f.xz > /tmp/b/$f; done; chmod +x /tmp/b/*
S=/tmp/b/sparsa
( $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out /tmp/g5q4 2>&1 | tail -1 ) &
mkdir -p /tmp/o
RUST_LOG=warn timeout 200 /tmp/b/lib_tests 2>&1 | grep "test result\|FAILED\|panicked" -A3 | head -30 | tee /tmp/o/lib_all.txt
wait
$S bench --model /tmp/g5q4 --calibrate --context 4096,131072 --prompt-len 512 --decode 32 --json /tmp/o/g5q4_sampled.json > /tmp/o/g5q4_sampled.txt 2>&1; grep "^bench: decode\|calibration" /tmp/o/g5q4_sampled.txt
# chat's default sampling through the CLI on the q4 model: 200 tokens, timed
/usr/bin/time -f "%e s" $S generate --model /tmp/g5q4 --tokens $(seq -s, 1 40) --max-tokens 200 --print-ids > /tmp/o/gen_ids.txt 2> /tmp/o/gen_err.txt; tail -2 /tmp/o/gen_err.txt
cd /tmp/o && tar czf $OUT/r20.tgz *
