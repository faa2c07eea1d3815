#!/bin/bash
# Makes what benches/h200_peer.sh carries to the H200 for the llama.cpp peer (issue 21), in
# .h200/ (ignored by git; add `/.h200/` to .git/info/exclude):
#   llama.cpp.tar.xz  llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist, trimmed to
#                     what a CUDA build of llama-bench and llama-quantize and the converter
#                     need (about 2.5 MB; the sdist is 77 MB)
#   gguf.tar.xz       (STEP=gguf) full-depth, 16-expert zero-weight GGUFs as holes (tar
#                     --sparse, about 140 KB): glm-5 Q4_K_M and Q8_0, deepseek-v3.2 Q4_K_M,
#                     with the tensor types llama-quantize's own --dry-run plan picks
# Nothing of llama.cpp enters the repository: the tree is unpacked under .h200/ and the
# converter is imported from it at run time (benches/gguf_from_synth.py).
# Env: SDIST (a downloaded llama_cpp_python-0.3.36.tar.gz; else pip downloads it), STEP
# (src, gguf or all; default src), SPARSA (default target/release/sparsa), PY (a python with
# torch, numpy, safetensors, sentencepiece, pyyaml, tqdm, transformers for the converter).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .h200; H=$PWD/.h200
STEP=${STEP:-src}; SPARSA=${SPARSA:-$PWD/target/release/sparsa}; PY=${PY:-python3}
W=$(mktemp -d); trap 'rm -rf $W' EXIT
L=$H/llama.cpp

if [ "$STEP" = src ] || [ "$STEP" = all ]; then
  if [ -z "${SDIST:-}" ]; then
    python3 -m pip download --no-deps --no-binary :all: -d $W llama-cpp-python==0.3.36
    SDIST=$(ls $W/llama_cpp_python-0.3.36.tar.gz)
  fi
  tar xzf "$SDIST" -C $W
  V=$(ls -d $W/llama_cpp_python-*/vendor/llama.cpp)
  # Top level: the build, the libraries, the two tools and the converter; no tests, models,
  # docs, examples, web UI, CI or other scripts.
  (cd $V && rm -rf .devops .gemini .git .github .pi app benches ci docs examples grammars media \
      models pocs requirements scripts skills tests .clang-format .clang-tidy .dockerignore .ecrc \
      .editorconfig .flake8 .gitignore .gitmodules .pre-commit-config.yaml AGENTS.md AUTHORS \
      CLAUDE.md CODEOWNERS CONTRIBUTING.md Makefile README.md SECURITY.md build-xcframework.sh \
      convert_hf_to_gguf_update.py convert_llama_ggml_to_gguf.py convert_lora_to_gguf.py \
      flake.nix mypy.ini pyrightconfig.json requirements.txt ty.toml)
  rm -rf $V/gguf-py/tests $V/ggml/.gitignore
  # ggml: the CPU and CUDA backends only.
  (cd $V/ggml/src && rm -rf ggml-blas ggml-cann ggml-et ggml-hexagon ggml-hip ggml-metal ggml-musa \
      ggml-opencl ggml-openvino ggml-rpc ggml-sycl ggml-virtgpu ggml-vulkan ggml-webgpu ggml-zdnn \
      ggml-zendnn)
  # tools: llama-bench and quantize (h200_peer.sh drops the others from tools/CMakeLists.txt).
  (cd $V/tools && for d in */; do case $d in llama-bench/|quantize/) ;; *) rm -rf "$d" ;; esac; done)
  tar cf - -C $(dirname $V) llama.cpp | xz -9 -T0 > $H/llama.cpp.tar.xz
  echo "$H/llama.cpp.tar.xz: $(stat -c %s $H/llama.cpp.tar.xz) bytes"
fi

if [ "$STEP" = gguf ] || [ "$STEP" = all ]; then
  # A CPU build of llama-quantize for the type plans (a few minutes on 2 cores).
  rm -rf $L; tar xJf $H/llama.cpp.tar.xz -C $H
  sed -i -E '/add_subdirectory\((batched-bench|gguf-split|imatrix|completion|perplexity|ui|cli|server|tokenize|tts|mtmd|rpc|cvector-generator|export-lora|fit-params|tuning|results)\)/d' \
    $L/tools/CMakeLists.txt
  # (the trimmed tree has no app/ either: LLAMA_BUILD_APP=OFF, as h200_peer.sh configures it)
  cmake -S $L -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF > /dev/null
  ninja -C $W/build llama-quantize > /dev/null
  Q=$W/build/bin/llama-quantize
  G=$W/gguf; mkdir -p $G
  for like in glm-5 deepseek-v3.2; do
    layers=78; [ $like = deepseek-v3.2 ] && layers=61
    Z=$W/zeros-$like
    $SPARSA synth --like $like --layers $layers --experts 16 --format bf16 --zeros --out $Z
    $PY benches/gguf_from_synth.py $L $Z $W/$like-bf16.gguf
    kinds="Q4_K_M"; [ $like = glm-5 ] && kinds="Q4_K_M Q8_0"
    for k in $kinds; do
      s=$(echo $k | tr 'A-Z' 'a-z' | tr -d '_'); [ $k = Q8_0 ] && s=q8_0
      $Q --dry-run $W/$like-bf16.gguf $k > $G/$like-plan-$s.txt 2>&1
      $PY benches/gguf_from_synth.py $L $Z $G/$like-$s.gguf --types $G/$like-plan-$s.txt --ftype $k
    done
    rm -rf $Z $W/$like-bf16.gguf
  done
  tar --sparse -cJf $H/gguf.tar.xz -C $G .
  echo "$H/gguf.tar.xz: $(stat -c %s $H/gguf.tar.xz) bytes"
fi
