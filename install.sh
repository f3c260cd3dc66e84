#!/bin/sh
# Install mlxmem from this clone into the active Python environment: `pip install -e .`, or
# `-e ".[EXTRAS]"` with an argument (`sh install.sh dev` for the tests' tools).
#
# Off macOS on Apple silicon, mlxmem depends on llama-cpp-python (the llama.cpp engine), which
# pip builds from source: cmake and a C++ compiler, a few minutes. The flags below make that
# build run on this CPU:
# - x86-64: without llama.cpp's AMX kernels. Its default build (-march=native) segfaults on the
#   first decode on Xeons with AMX (Sapphire Rapids and later, common in clouds); GCC and Clang
#   let the explicit flags below win over -march=native whatever their order.
# - everywhere: without the multimodal library (LLAVA_BUILD), which mlxmem does not use.
# --no-cache-dir: pip's cache may hold a llama-cpp-python wheel built with other flags.
# .ci/llamacpp-wheel builds CI's wheel with the same flags (tests/test_default_model.py checks).
set -eu
cd "$(dirname "$0")"
target=.
if [ $# -gt 0 ]; then
    target=".[$1]"
fi
CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF"
if [ "$(uname -m)" = x86_64 ]; then
    CMAKE_ARGS="$CMAKE_ARGS -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CFLAGS="${CFLAGS:-} $noamx"
    CXXFLAGS="${CXXFLAGS:-} $noamx"
    export CFLAGS CXXFLAGS
fi
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
export CMAKE_ARGS CMAKE_BUILD_PARALLEL_LEVEL
python=$(command -v python || command -v python3)
exec "$python" -m pip install --no-cache-dir -e "$target"
