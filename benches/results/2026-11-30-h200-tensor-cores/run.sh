#!/bin/bash
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /tmp/b; xz -dc .h200/sparsa.xz > /tmp/b/sparsa; xz -dc .h200/lib_tests.xz > /tmp/b/lib_tests; chmod +x /tmp/b/*
S=/tmp/b/sparsa
( $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out /tmp/g5q4 2>&1 | tail -1 ) &
$S devices > $OUT/devices.txt 2>&1
echo "== all lib tests (tensor-core GEMM tile)"
RUST_LOG=warn timeout 300 /tmp/b/lib_tests 2>&1 | grep "test result\|FAILED\|panicked" | head -20 | tee $OUT/lib_all.txt
wait
for tc in 0 1; do
  echo "== SPARSA_TENSOR_CORES=$tc"
  SPARSA_TENSOR_CORES=$tc timeout 200 $S bench --model /tmp/g5q4 --calibrate --context 4096 --prompt-len 512,4096 --decode 8 --json $OUT/g5q4_tc$tc.json > $OUT/g5q4_tc$tc.txt 2>&1; echo "rc $?"
  grep "prefill\|gemm\|calibration" $OUT/g5q4_tc$tc.txt | grep -v "^bench"
  SPARSA_TENSOR_CORES=$tc $S generate --model /tmp/g5q4 --tokens $(seq -s, 1 40) --max-tokens 12 --temperature 0 --print-ids 2>&1 | tail -1
  SPARSA_TENSOR_CORES=$tc $S logits --model /tmp/g5q4 --tokens $(seq -s, 1 100) --out /tmp/logits_$tc.safetensors 2>&1 | tail -1
done
python3 - <<'PY' 2>&1 | tee $OUT/logits_cmp.txt
from safetensors.torch import load_file
a = load_file("/tmp/logits_0.safetensors")["logits"].double()
b = load_file("/tmp/logits_1.safetensors")["logits"].double()
d = (a - b).abs()
print(f"100-token prefill, tensor-core tile vs f32 tile: max |diff| {d.max():.3e}, max |logit| {a.abs().max():.3f}, rel {(d.max()/a.abs().max()):.3e}, argmax equal {(a.argmax(-1)==b.argmax(-1)).float().mean():.3f}")
PY
cd $OUT && tar czf bench.tgz *.txt *.json && rm -f *.json
