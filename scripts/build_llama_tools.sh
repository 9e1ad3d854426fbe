#!/usr/bin/env bash
# Builds llama.cpp's own llama-batched-bench and llama-server from the SAME vendored llama.cpp
# source as the installed llama-cpp-python (its sdist), for `magnitude-bench throughput`.
# Only those two targets (and what they link) are built; the result is cached outside the repo:
#
#   ~/.cache/magnitude-tui/llama-tools/<llama-cpp-python version>-<variant>/bin/
#
#   scripts/build_llama_tools.sh            variant of the installed llama-cpp-python (vulkan or cpu)
#   scripts/build_llama_tools.sh --cpu      CPU-only tools (same ggml CPU code, far quicker to build)
#   scripts/build_llama_tools.sh --vulkan   Vulkan + CPU tools (needs the Vulkan SDK, like setup.sh)
#
# Env: MAGNITUDE_TOOLS_CACHE (default ~/.cache/magnitude-tui/llama-tools), MAGNITUDE_BUILD_JOBS
#      (default: nproc), MAGNITUDE_VENV (default .venv; only read to detect the installed variant).
# The cmake options mirror the llama-cpp-python wheel build (Release, shared libs, GGML_NATIVE and
# the other ggml defaults); the web UI is left out (it would be downloaded) and so are curl/OpenSSL.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MAGNITUDE_VENV:-$ROOT/.venv}
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=python3
CACHE_ROOT=${MAGNITUDE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/magnitude-tui/llama-tools}
JOBS=${MAGNITUDE_BUILD_JOBS:-$(nproc)}
TARGETS=(llama-batched-bench llama-server)

say() { printf '\033[1m[llama-tools]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[llama-tools] error:\033[0m %s\n' "$*" >&2; exit 1; }

source "$(dirname "$0")/lib.sh"

VARIANT=""
for arg in "$@"; do
  case "$arg" in
    --cpu) VARIANT=cpu ;;
    --vulkan) VARIANT=vulkan ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $arg (use --cpu or --vulkan)" ;;
  esac
done
if [ -z "$VARIANT" ]; then
  VARIANT=$(installed_llama_variant)
  VARIANT=${VARIANT##*-}
  [ -n "$VARIANT" ] || { VARIANT=vulkan; say "llama-cpp-python not found in $VENV; building the vulkan variant"; }
fi
case "$VARIANT" in
  vulkan) VARIANT_ARGS=(-DGGML_VULKAN=on) ;;
  cpu) VARIANT_ARGS=(-DGGML_VULKAN=off) ;;
esac

OUT="$CACHE_ROOT/$LLAMA_CPP_PYTHON_VERSION-$VARIANT"
STAMP="$OUT/bin/BUILD-INFO"
# Without ggml's AMX kernels where this machine cannot run them, as setup.sh builds the wheel (lib.sh).
EXTRA_FLAGS=$(extra_cpu_flags)
if [ -f "$STAMP" ] && [ -x "$OUT/bin/llama-batched-bench" ] && [ -x "$OUT/bin/llama-server" ]; then
  if [ "$(sed -n 's/^cpu_flags=//p' "$STAMP")" = "$EXTRA_FLAGS" ]; then
    say "already built: $OUT/bin (remove $OUT to rebuild)"
    exit 0
  fi
  say "the tools in $OUT were built with other CPU flags than this machine needs ($EXTRA_FLAGS): rebuilding"
  rm -rf "$OUT"
fi
command -v cmake >/dev/null || die "cmake is required (apt-get install cmake)"
command -v ninja >/dev/null || die "ninja is required (apt-get install ninja-build)"

# 1. The exact sdist llama-cpp-python was built from, unpacked once per version.
SRC_ROOT="$CACHE_ROOT/src"
SRC="$SRC_ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  mkdir -p "$SRC_ROOT"
  say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (source of the vendored llama.cpp)"
  "$PY" -m pip download -q --no-deps --no-binary :all: --no-cache-dir \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$SRC_ROOT"
  tar -xzf "$SRC_ROOT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$SRC_ROOT"
fi
# The Vulkan header guard setup.sh applies to the wheel's source (idempotent).
[ "$VARIANT" = vulkan ] && "$PY" "$ROOT/scripts/patch_vulkan_headers.py" "$SRC"

# 2. Configure and build only the two tools. The build dir is kept so an interrupted build resumes.
BUILD="$OUT/build"
mkdir -p "$BUILD"
CMAKE_ARGS=(
  -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  "${VARIANT_ARGS[@]}"
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
  # Binaries find their shared libraries next to themselves, wherever the cache lives.
  '-DCMAKE_INSTALL_RPATH=$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
)
say "configuring ($VARIANT): cmake ${CMAKE_ARGS[*]}"
LOG="$OUT/build.log"
CFLAGS="${CFLAGS:-} $EXTRA_FLAGS" CXXFLAGS="${CXXFLAGS:-} $EXTRA_FLAGS" \
  cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${CMAKE_ARGS[@]}" >"$LOG" 2>&1 \
  || { tail -n 30 "$LOG" >&2; die "cmake configure failed (log: $LOG)"; }
say "building ${TARGETS[*]} with $JOBS jobs (CPU: ~10 min on 2 cores; Vulkan adds the shaders); log: $LOG"
set +e
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" 2>&1 | tee -a "$LOG" | "$PY" "$ROOT/scripts/build_progress.py"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || { tail -n 40 "$LOG" >&2; die "build failed (log: $LOG)"; }

# 3. Binaries and their shared libraries side by side, plus a stamp saying what they are.
mkdir -p "$OUT/bin"
for t in "${TARGETS[@]}"; do cp -f "$BUILD/bin/$t" "$OUT/bin/"; done
find "$BUILD" -name '*.so*' \( -type f -o -type l \) -exec cp -a {} "$OUT/bin/" \;
"$OUT/bin/llama-server" --version >"$OUT/bin/version.txt" 2>&1 || true
{
  echo "llama_cpp_python_version=$LLAMA_CPP_PYTHON_VERSION"
  echo "variant=$VARIANT"
  echo "source=$SRC/vendor/llama.cpp"
  echo "cmake_args=${CMAKE_ARGS[*]}"
  echo "cpu_flags=$EXTRA_FLAGS"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "llama_build=$(grep -m1 -i 'version' "$OUT/bin/version.txt" || true)"
} >"$STAMP"
say "done: $OUT/bin/{llama-batched-bench,llama-server}"
