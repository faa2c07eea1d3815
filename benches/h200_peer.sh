#!/bin/bash
# Issue 21: llama.cpp beside `sparsa bench` on the H200, in one device call (meant for <= 9 min).
# Carried in .h200/ (benches/peer_prepare.sh makes them): llama.cpp.tar.xz (trimmed llama.cpp source of llama-cpp-python 0.3.36's
# vendor/llama.cpp) or llama-bin.tar.xz (what an earlier run of this script built: then no
# build), and sparsa.xz (stripped release sparsa with `synth --zeros`).
# 2 (run first; SKIP_SPARSA=1 skips). sparsa bench on a q4 synth of the same shape (all
#    zeros as holes unless SPARSA_RANDOM=1) -> sparsa_bench.txt; deleted.
# 1. Build llama.cpp with CUDA for sm_90 (llama-bench, llama-quantize; shared libs, so the
#    CUDA code is in one libggml-cuda.so; 354 s on the H200 with -j16) in .h200/llama.cpp ->
#    build.txt; pack the binaries, libraries and the converter's Python into
#    $OUT/llama-bin.tar.xz (42.8 MB in three 15 MB parts: too large to carry beside
#    sparsa.xz, so every call builds; SKIP_BUILD_PACK=1 skips the packing).
# 3. The GGUF: from .h200/gguf.tar.xz if carried (full depth; see step 3 below), else
#    `sparsa synth --zeros` (bf16, holes: no disk) -> GGUF bf16 (holes, benches/gguf_from_synth.py)
#    -> `llama-quantize --dry-run` plan -> GGUF Q4_K_M with those types (holes again). With
#    QUANT=real, llama-quantize writes the real Q4_K_M (~39 GB on /tmp, timed) and that is the
#    one benched. Q8=1 also makes (holes) and benches Q8_0 (~69 GB: only as holes on this disk).
# 4. llama-bench -fa 1 -ngl 99: pp2048 + tg128 (-r 2), then tg32 at depths $DEPTHS -> llama_bench.txt.
# Every step checks the time left (BUDGET_S, default 510 s from the start) and is skipped or
# cut short rather than overrunning. Logs of steps 1b/3 -> steps.txt; a summary -> summary.txt.
# Env: BUILD_ONLY (step 1 alone: a call before the peer's, on cores taskset gives it, leaves the
#      build in .h200/llama.cpp/build for the next call on the same warm machine),
#      SPARSA_FORMATS, SPARSA_CTXS, SPARSA_KEEP_S (step 2, see there),
#      LIKE (glm-5), LAYERS (78; 61 for deepseek-v3.2), GGUF=device, EXPERTS (16),
#      DEPTHS (4096,32768), SKIP_SPARSA, SKIP_BUILD_PACK,
#      QUANT (holes|real), Q8, BUDGET_S, JOBS (16), SPARSA_CTX (4096), REPS (2), PP (2048),
#      TG (128), TGD (32), SKIP_PP (no pp+tg run, only tg at depth), LB_ARGS (more llama-bench flags, e.g. "-mmp 0"), CUDA=0 (CPU build:
#      for trying the script on a machine without a GPU).
set -u
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
T0=$(date +%s); BUDGET=${BUDGET_S:-510}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
pos() { [ "$1" -gt 1 ] && echo "$1" || echo 1; } # a timeout of at least 1 s
el() { echo $(($(date +%s) - T0)); }
SUM=$OUT/summary.txt; STEPS=$OUT/steps.txt; LBT=$OUT/llama_bench.txt
note() { echo "[$(el)s] $*" | tee -a $SUM; }
LIKE=${LIKE:-glm-5}; FULL=78; [ "$LIKE" = deepseek-v3.2 ] && FULL=61; LAYERS=${LAYERS:-$FULL}; EXPERTS=${EXPERTS:-16}; DEPTHS=${DEPTHS:-4096,32768}
REPS=${REPS:-2}; JOBS=${JOBS:-16}
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
# The Vulkan loader for sparsa (carry .gl, see the device README).
if ls .gl/*.deb > /dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
  F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
fi
note "peer: $LIKE layers=$LAYERS experts=$EXPERTS depths=$DEPTHS quant=${QUANT:-holes} budget=${BUDGET}s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $SUM 2>&1
nvcc --version 2>&1 | tail -2 >> $SUM; df -h /tmp | tail -1 >> $SUM; nproc >> $SUM
python3 -c "import torch, numpy, yaml, tqdm, transformers, safetensors; print('python:', torch.__version__, numpy.__version__, transformers.__version__)" >> $SUM 2>&1

S=/tmp/sparsa
[ -f .h200/sparsa.xz ] && { xz -dc .h200/sparsa.xz > $S; chmod +x $S; }
$S synth --help 2>&1 | grep -q -- --zeros || note "WARNING: $S has no synth --zeros (build it from a tree with branch llama-peer)"
SQ=/tmp/sq4 # the sparsa q4 synth (38 GB at full GLM-5 depth; holes with --zeros)
# 2 (first). sparsa bench, before the build: a synth written beside the build took 7 min
# instead of 1.5 (both want every core), and the bench's host thread would compete too.
# SPARSA_RANDOM=1: random q4 weights (~100 s to write); else all zeros, as holes (no time, no
# disk), like the zero-weight GGUF llama.cpp runs (the same ties in the routers).
# SPARSA_FORMATS (default q4, and q8 with Q8=1) x SPARSA_CTXS (default 4096 and 32768, the
# depths llama-bench runs), each bench cut to what the budget leaves for llama.cpp (SPARSA_KEEP_S,
# default 400 s).
if [ -z "${SKIP_SPARSA:-}" ] && [ -z "${BUILD_ONLY:-}" ] && [ -x $S ]; then
  Z=--zeros; [ -n "${SPARSA_RANDOM:-}" ] && Z=
  FMTS=${SPARSA_FORMATS:-q4}; [ -n "${Q8:-}" ] && [ -z "${SPARSA_FORMATS:-}" ] && FMTS="q4 q8"
  for fmt in $FMTS; do
    rm -rf $SQ
    ( time $S synth --like $LIKE --layers $LAYERS --experts $EXPERTS --format $fmt $Z --out $SQ ) \
      > /tmp/sq4.log 2>&1
    tr '\r' '\n' < /tmp/sq4.log | tail -4 >> $STEPS
    note "sparsa $fmt synth ${Z:-random}: $(grep -E '^real' /tmp/sq4.log)"
    for ctx in ${SPARSA_CTXS:-${SPARSA_CTX:-4096 32768}}; do
      echo "== sparsa bench $LIKE $fmt ${Z:-random} --context $ctx --decode 32" >> $OUT/sparsa_bench.txt
      timeout $(pos $(($(left) - ${SPARSA_KEEP_S:-400}))) $S bench --model $SQ --context $ctx --decode 32 \
        --prompt-len 0 ${SPARSA_BENCH_FLAGS:---no-profile} >> $OUT/sparsa_bench.txt 2>&1
      note "sparsa bench $fmt $ctx rc=$?: $(grep -E '^bench: decode' $OUT/sparsa_bench.txt | tail -1)"
    done
    rm -rf $SQ
  done
fi

# 1. llama.cpp
LB=/tmp/llama-bin; rm -rf $LB; mkdir -p $LB
if ls .h200/llama-bin.tar.xz* > /dev/null 2>&1; then
  cat $(ls .h200/llama-bin.tar.xz* | sort) | tar xJf - -C $LB
  note "llama.cpp: carried binaries: $(ls $LB | tr '\n' ' ')"
else
  # in the repo copy's (ignored) .h200/: a warm machine keeps it, and a second call after a
  # build cut short by the budget goes on where ninja stopped
  L=$PWD/.h200/llama.cpp
  if [ ! -f $L/build/build.ninja ]; then
    rm -rf $L; tar xJf .h200/llama.cpp.tar.xz -C .h200
    # the trimmed tree has only these two tools: configure only them
    sed -i -E '/add_subdirectory\((batched-bench|gguf-split|imatrix|completion|perplexity|ui|cli|server|tokenize|tts|mtmd|rpc|cvector-generator|export-lora|fit-params|tuning|results)\)/d' \
      $L/tools/CMakeLists.txt
  fi
  if [ "${CUDA:-1}" = 0 ]; then
    GPU_FLAGS="-DGGML_NATIVE=ON"
  else
    GPU_FLAGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF
      -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  fi
  B0=$(date +%s)
  { cmake -S $L -B $L/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      $GPU_FLAGS -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
    && timeout $(pos $(($(left) - 60))) ninja -C $L/build -j$JOBS llama-bench llama-quantize; } \
    >> $OUT/build.txt 2>&1
  RC=$?
  note "llama.cpp build: rc=$RC in $(($(date +%s) - B0)) s (log: build.txt)"
  grep -E "error|FAILED" $OUT/build.txt | head -5 >> $SUM
  cp -a $L/build/bin/llama-bench $L/build/bin/llama-quantize $L/build/bin/*.so* $LB/ 2>/dev/null
  mkdir -p $LB/py; cp -a $L/convert_hf_to_gguf.py $L/conversion $L/gguf-py $LB/py/
  strip $LB/llama-bench $LB/llama-quantize $LB/*.so* 2>/dev/null
  if [ -x $LB/llama-bench ] && [ -z "${SKIP_BUILD_PACK:-}" ]; then
    ( cd $LB && tar cf - . | xz -6 -T$JOBS > $OUT/llama-bin.tar.xz )
    SZ=$(stat -c %s $OUT/llama-bin.tar.xz)
    if [ $SZ -gt 16000000 ]; then
      split -b 15000000 -d -a 1 $OUT/llama-bin.tar.xz $OUT/llama-bin.tar.xz. && rm $OUT/llama-bin.tar.xz
    fi
    note "packed llama-bin.tar.xz: $SZ bytes ($(ls $OUT | grep llama-bin | tr '\n' ' '))"
  fi
fi
[ -n "${BUILD_ONLY:-}" ] && { note "BUILD_ONLY: stop after the build"; exit 0; }
export LD_LIBRARY_PATH=$LB:${LD_LIBRARY_PATH:-}
PYSRC=$LB/py
ls -la $LB >> $SUM

# 3. GGUF: carried (.h200/gguf.tar.xz: full-depth, 16-expert glm-5 q4km + q8_0 and
# deepseek-v3.2 q4km, made by gguf_from_synth.py as holes and packed with tar --sparse), or
# made here (GGUF=device, or another depth / expert count).
[ -x $LB/llama-bench ] || { note "no llama-bench: stop"; cat $SUM; exit 1; }
G=/tmp/gguf; rm -rf $G; mkdir -p $G
Z=$G/zeros
step() { # name, command...
  local name=$1; shift; local t=$(date +%s)
  echo "== $name: $*" >> $STEPS
  "$@" >> $STEPS 2>&1; local rc=$?
  note "$name: rc=$rc, $(($(date +%s) - t)) s"
  return $rc
}
export PYTHONUNBUFFERED=1
MODELS=()
if [ -f .h200/gguf.tar.xz ] && [ "${GGUF:-}" != device ] && [ $LAYERS = $FULL ] && [ $EXPERTS = 16 ] \
    && [ "${QUANT:-holes}" = holes ]; then
  # only the files needed (were holes not kept here, each would take its full size on disk)
  W="./$LIKE-q4km.gguf ./$LIKE-plan-q4km.txt"; [ -n "${Q8:-}" ] && W="$W ./$LIKE-q8_0.gguf"
  step untar_gguf tar -xJf .h200/gguf.tar.xz -C $G $W
  note "GGUF on disk: $(du -sh $G | cut -f1) for $(du -sh --apparent-size $G | cut -f1)"
  grep -E "quant size" $G/$LIKE-plan-q4km.txt >> $SUM
  MODELS+=($G/$LIKE-q4km.gguf)
  [ -n "${Q8:-}" ] && [ -f $G/$LIKE-q8_0.gguf ] && MODELS+=($G/$LIKE-q8_0.gguf)
else
  step synth_zeros $S synth --like $LIKE --layers $LAYERS --experts $EXPERTS --format bf16 --zeros --out $Z
  note "zero synth on disk: $(du -sh $Z | cut -f1) for $(du -sh --apparent-size $Z | cut -f1)"
  step convert_bf16 python3 benches/gguf_from_synth.py $PYSRC $Z $G/bf16.gguf
  step plan_q4km sh -c "$LB/llama-quantize --dry-run $G/bf16.gguf Q4_K_M > $G/plan_q4km.txt 2>&1"
  grep -E "quant size|model size" $G/plan_q4km.txt >> $SUM
  grep -oE "\([a-zA-Z0-9_]+\)$" $G/plan_q4km.txt | sort | uniq -c | tr '\n' ' ' >> $SUM; echo >> $SUM
  if [ "${QUANT:-holes}" = real ]; then
    step quantize_real timeout $(pos $(($(left) - 120))) $LB/llama-quantize $G/bf16.gguf $G/q4km.gguf Q4_K_M $JOBS
  else
    step convert_q4km python3 benches/gguf_from_synth.py $PYSRC $Z $G/q4km.gguf --types $G/plan_q4km.txt --ftype Q4_K_M
  fi
  MODELS+=($G/q4km.gguf)
  if [ -n "${Q8:-}" ]; then
    step plan_q8 sh -c "$LB/llama-quantize --dry-run $G/bf16.gguf Q8_0 > $G/plan_q8.txt 2>&1"
    grep -E "quant size" $G/plan_q8.txt >> $SUM
    step convert_q8 python3 benches/gguf_from_synth.py $PYSRC $Z $G/q8.gguf --types $G/plan_q8.txt --ftype Q8_0
    MODELS+=($G/q8.gguf)
  fi
fi
ls -las $G >> $SUM; df -h /tmp | tail -1 >> $SUM

# 4. llama-bench
lbench() { # label, args...
  local label=$1; shift; local t=$(date +%s)
  echo "== $label: $*" >> $LBT
  timeout $(pos $(($(left) - 20))) $LB/llama-bench "$@" -o md >> $LBT 2>> $STEPS
  note "llama-bench $label: rc=$?, $(($(date +%s) - t)) s"
}
for M in "${MODELS[@]}"; do
  [ -z "${SKIP_PP:-}" ] && [ $(left) -gt 60 ] && lbench "pp+tg $(basename $M)" -m $M -p ${PP:-2048} -n ${TG:-128} -r $REPS \
    -fa 1 -ngl 99 ${LB_ARGS:-}
  [ $(left) -gt 60 ] && lbench "tg at depth $(basename $M)" -m $M -p 0 -n ${TGD:-32} -d $DEPTHS \
    -r $REPS -fa 1 -ngl 99 ${LB_ARGS:-}
done
grep -E "^\| " $LBT >> $SUM

# 5. clean up
rm -rf $G $SQ
note "done, $(left) s of the budget left"
cat $SUM
