#!/usr/bin/env bash
# Build the benchmark peers' own environment, apart from ortserve's dependencies.
#
#   bash benchmarks/peers/setup.sh            # idempotent; re-running skips what is done
#
# Creates benchmarks/.venv-peers with
#   torch==2.13.0 (CPU wheel; installed FIRST, any other spelling pulls a CUDA build)
#   onnxruntime-genai 0.18.0 (+ its model builder), transformers, gguf
#   llama.cpp from the llama-cpp-python 0.3.36 sdist's vendored tree, built once with CMake:
#   libllama, llama-server (native, parallel slots), llama-quantize (f32 GGUF -> q8_0 / q4_0),
#   llama-bench, llama-batched-bench in benchmarks/.venv-peers/build-llama.cpp/bin/;
#   then llama-cpp-python 0.3.36[server] bindings from the same sdist, loading that libllama.
# The sdist stays unpacked in benchmarks/.venv-peers/src/: convert_hf_to_gguf.py lives in it.
# The llama.cpp build takes ~10-20 min on 2 cores; it runs under nice -n 10.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${PEERS_VENV:-$HERE/../.venv-peers}"
PY="${PYTHON:-python3}"
LLAMA_CPP_PYTHON_VERSION=0.3.36
ORT_GENAI_VERSION=0.18.0

mkdir -p "$VENV"
VENV="$(cd "$VENV" && pwd)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

stamp() { [ -f "$VENV/.done-$1" ]; }
mark() { touch "$VENV/.done-$1"; }

if ! stamp torch; then
  echo "[peers] torch==2.13.0 (CPU)"
  "${PIP[@]}" torch==2.13.0
  mark torch
fi

if ! stamp python-deps; then
  echo "[peers] onnxruntime-genai, transformers, gguf"
  "${PIP[@]}" "onnxruntime-genai==$ORT_GENAI_VERSION" "transformers==5.23.*" gguf safetensors \
    sentencepiece protobuf accelerate numpy httpx tqdm scikit-build-core cmake ninja onnx onnx-ir
  mark python-deps
fi

SRC="$VENV/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -d "$SRC" ]; then
  echo "[peers] fetching llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
  mkdir -p "$VENV/src"
  "$VENV/bin/python" -m pip download --disable-pip-version-check -q --no-deps --no-build-isolation \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$VENV/src"
  tar xzf "$VENV/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$VENV/src"
fi

# llama.cpp itself: one CMake build of the sdist's vendored tree, only the targets we run.
# (llama-cpp-python's own server serves one request at a time, no parallel slots, so serving
# workloads use the native llama-server of the same llama.cpp commit.)
BUILD="$VENV/build-llama.cpp"
BIN="$BUILD/bin"
if ! stamp llama.cpp; then
  echo "[peers] building llama.cpp from the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (nice -n 10, 2 jobs)"
  # GGML_NATIVE turns on ggml's AMX backend on CPUs that list amx_tile; in these VMs its first tile
  # instruction (ldtilecfg) crashes, so AMX is switched off there and ggml keeps its AVX-512 VNNI path.
  NO_AMX=""
  if grep -qw amx_tile /proc/cpuinfo; then NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
  "$VENV/bin/cmake" -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$VENV/cmake-configure.log"
  nice -n 10 "$VENV/bin/cmake" --build "$BUILD" -j 2 --target llama llama-server llama-quantize llama-bench llama-batched-bench
  mark llama.cpp
fi
# llama-imatrix (benchmarks/quality.py's calibrated llama.cpp rows), on the same build.
if ! stamp llama-imatrix; then
  nice -n 10 "$VENV/bin/cmake" --build "$BUILD" -j 2 --target llama-imatrix
  mark llama-imatrix
fi

# The Python bindings of the same sdist, on that build's libllama (no second compile).
if ! stamp llama-cpp-python; then
  echo "[peers] llama-cpp-python $LLAMA_CPP_PYTHON_VERSION[server] bindings"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "${PIP[@]}" --no-build-isolation "$SRC[server]"
  LIBDIR="$("$VENV/bin/python" -c 'import importlib.util,os;print(os.path.join(importlib.util.find_spec("llama_cpp").submodule_search_locations[0],"lib"))')"
  mkdir -p "$LIBDIR"
  for so in "$BIN"/lib*.so*; do ln -sf "$so" "$LIBDIR/"; done
  mark llama-cpp-python
fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "onnxruntime-genai", "llama_cpp_python", "transformers", "gguf"):
    print(f"[peers] {name} {md.version(name)}")
PY
ls "$BIN" | grep -v "\.so"
echo "[peers] ready: $VENV"
