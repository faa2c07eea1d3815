#!/bin/bash
# Expert offloading on the H200 (device run of 2026-12-01): GLM-5-shaped q4, 4 layers
# (1 dense + 3 MoE x 256 experts, 19.3 GB), budgets holding 25 % / 50 % of the routed
# experts. Needs the release binary in .h200/sparsa.xz and examples/h2d in .h200/h2d.xz.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
R=$OUT/r; mkdir -p $R
SP=/tmp/sparsa; xz -dc .h200/sparsa.xz > $SP; chmod +x $SP
xz -dc .h200/h2d.xz > /tmp/h2d; chmod +x /tmp/h2d
D=/tmp/g5q4
( free -g; nproc; nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv ) > $R/machine.txt 2>&1
[ -d $D ] || $SP synth --like glm-5 --layers 4 --format q4 --out $D > $R/synth.txt 2>&1
/tmp/h2d $D/model-00002-of-00005.safetensors > $R/h2d.txt 2>&1
B="$SP bench --model $D --context 4096 --decode 64 --prompt-len 0 --no-profile"
# Resident (the plan line gives the exact bytes of the fixed part and of one expert).
RUST_LOG=info timeout 300 $B --gpu-memory 130GiB > $R/resident.txt 2>&1
FIXED=$(grep -o 'fixed [0-9]* B' $R/resident.txt | head -1 | grep -o '[0-9]*')
EB=$(grep -o 'expert [0-9]* B' $R/resident.txt | head -1 | grep -o '[0-9]*')
B25=$((FIXED + EB * 768 / 4 + EB)); B50=$((FIXED + EB * 768 / 2 + EB))
echo "fixed=$FIXED expert=$EB b25=$B25 b50=$B50" > $R/budget.txt
run() { name=$1; shift; RUST_LOG=info timeout 200 $B "$@" > $R/$name.txt 2>&1; }
run b25_uniform_lfu --gpu-memory $B25
run b25_uniform_lru --gpu-memory $B25 --expert-policy lru
run b25_uniform_lfu_prefetch --gpu-memory $B25 --expert-prefetch
run b25_zipf1_lfu --gpu-memory $B25 --expert-routing zipf:1.0
run b25_zipf1_lru --gpu-memory $B25 --expert-routing zipf:1.0 --expert-policy lru
run b50_zipf1_lfu --gpu-memory $B50 --expert-routing zipf:1.0
# Host memory: page cache dropped first; then under an 8 GiB cgroup memory limit (the
# model's files are 19.3 GB, so experts come from the disk again and again).
sync; echo 3 > /proc/sys/vm/drop_caches && run b25_uniform_lfu_cold --gpu-memory $B25
CG=/sys/fs/cgroup/sparsa
if mkdir -p $CG && echo 8G > $CG/memory.max; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  ( echo $BASHPID > $CG/cgroup.procs; run b25_uniform_lfu_cgroup8g --gpu-memory $B25 )
  ( echo $BASHPID > $CG/cgroup.procs; run b25_zipf1_lfu_cgroup8g --gpu-memory $B25 --expert-routing zipf:1.0 )
  cat $CG/memory.peak > $R/cgroup.txt 2>&1
fi
cd $OUT && tar czf r.tgz r && rm -rf r
