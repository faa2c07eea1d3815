#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; for f in sparsa lib_tests gemv_shapes; do xz -dc .h200/$f.xz > /tmp/b/$f; done; chmod +x /tmp/b/*
echo "== lib tests"
RUST_LOG=warn timeout 200 /tmp/b/lib_tests 2>&1 | grep "test result\|FAILED\|panicked" -A3 | head -30 | tee $OUT/lib_all.txt
/tmp/b/sparsa devices > $OUT/devices.txt 2>&1
SPARSA=/tmp/b/sparsa GEMV_SHAPES=/tmp/b/gemv_shapes SKIP_128K=1 TF_CONTEXTS=512,4096 timeout 560 bash benches/h200.sh 2>&1 | tail -5
grep -h "^bench: decode\|^bench: prefill" $OUT/*.txt
grep -h "all " $OUT/gemv_shapes.txt
python3 -c "import json; d=json.load(open('$OUT/tf_g5.json')); print(d)" 2>&1 | head -5
