# Shared shell helpers for scripts/setup.sh and scripts/build_llama_tools.sh (sourced, not run).

# Prints "<version>-<variant>" (variant: vulkan | cpu) of the llama-cpp-python installed for the
# interpreter $PY, or nothing when it is not installed.
installed_llama_variant() {
  "$PY" - <<'PY' 2>/dev/null || true
import importlib.metadata as md, pathlib
try:
    dist = md.distribution("llama_cpp_python")
except md.PackageNotFoundError:
    raise SystemExit
lib = pathlib.Path(dist.locate_file("llama_cpp/lib"))
print(f"{dist.version}-{'vulkan' if any(lib.glob('libggml-vulkan*')) else 'cpu'}")
PY
}

# Prints the compiler flags both native builds need on this machine beyond GGML_NATIVE's
# -march=native, or nothing.
# - AMX: a CPU can list AMX (amx_tile in /proc/cpuinfo) that the kernel or a sandbox does not let a
#   process use, while still granting ggml's permission request: its AMX kernels then die on their
#   first tile instruction (SIGILL) at the first prompt. A tiny probe runs one tile instruction;
#   when it dies, the AMX kernels are left out of the build.
# - AVX512-FP16: where -march=native turns it on, ggml's half-precision vectors take 32 lanes and
#   128 elements a step, and every shorter vector runs scalar. The CPU flash-attention kernel
#   accumulates each cell's V row (head size: 64 in small models) in such a vector, so flash
#   attention runs about twice as slow as on the 16-lane path every other AVX-512 CPU takes.
extra_cpu_flags() {
  local flags=()
  if grep -qw amx_tile "${MAGNITUDE_CPUINFO:-/proc/cpuinfo}" 2>/dev/null && amx_faults; then
    flags+=(-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
  fi
  if native_avx512fp16; then flags+=(-mno-avx512fp16); fi
  echo "${flags[*]}"
}

# A build tag naming what extra_cpu_flags leaves out ("-noamx", "-nofp16", both, or nothing).
cpu_flags_tag() {
  local tag=""
  case " $1 " in *" -mno-amx-tile "*) tag+="-noamx" ;; esac
  case " $1 " in *" -mno-avx512fp16 "*) tag+="-nofp16" ;; esac
  echo "$tag"
}

# Whether the compiler's -march=native turns AVX512-FP16 on here. The macros are read whole before
# they are searched: piped into `grep -q`, the compiler can die of SIGPIPE once grep has its match,
# and under `set -o pipefail` (setup.sh) that reads as "no".
native_avx512fp16() {
  local defines
  defines=$(cc -march=native -dM -E -x c /dev/null 2>/dev/null) || return 1
  [[ $defines == *__AVX512FP16__* ]]
}

# Whether a process here dies running an AMX tile instruction (after asking the kernel for them).
# False when the probe does not compile: a compiler without AMX builds no AMX kernels either, and
# would refuse the -mno-amx flags.
amx_faults() {
  local dir rc=1
  dir=$(mktemp -d)
  cat >"$dir/probe.c" <<'C'
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
int main(void) {
    unsigned char cfg[64];
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 0;
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;    /* palette 1 */
    cfg[16] = 64;  /* tile 0: 64 bytes a row */
    cfg[48] = 16;  /* tile 0: 16 rows */
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
C
  if cc -O1 -mamx-tile "$dir/probe.c" -o "$dir/probe" >/dev/null 2>&1; then
    ("$dir/probe") >/dev/null 2>&1 || rc=0
  fi
  rm -rf "$dir"
  return "$rc"
}

# Whether the llama-cpp-python installed for $PY carries ggml's AMX kernels.
installed_llama_has_amx() {
  local lib
  lib=$("$PY" -c 'import importlib.metadata as md; print(md.distribution("llama_cpp_python").locate_file("llama_cpp/lib"))' 2>/dev/null) || return 1
  grep -qa ggml_backend_amx_mul_mat "$lib"/libggml-cpu.so* 2>/dev/null
}
