"""The native builds leave ggml's AMX kernels out where a CPU lists AMX that a process here cannot
run (scripts/lib.sh: extra_cpu_flags): such a build dies on its first prompt. They leave AVX512-FP16
out where -march=native would turn it on: ggml's half-precision vectors then run every vector
shorter than 128 elements scalar, the flash-attention kernel's 64-wide heads included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.needs import llama_tools

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "scripts" / "lib.sh"
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LISTS_AMX = "flags\t\t: fpu sse avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n"
NO_AMX_LISTED = "flags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
NO_FP16 = "-mno-avx512fp16"


def _lib(call: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `call` in bash with lib.sh sourced (PY: this interpreter, as setup.sh sets it)."""
    return subprocess.run(["bash", "-c", f'PY="{sys.executable}"; source "{LIB}"; {call}'],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)


def _fake_cc(tmp_path: Path, probe_body: str, native_defines: str = "") -> dict[str, str]:
    """A PATH whose `cc` "compiles" the probe into a shell script running `probe_body` (exit 132:
    how a shell reports a program that died of SIGILL), and prints `native_defines` when asked for
    its predefined macros (`-dM -E`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cc = bin_dir / "cc"
    cc.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -dM ] && '
                  f'{{ printf "{native_defines}"; exit 0; }}; done\n'
                  'while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
                  f'printf "#!/bin/sh\\n{probe_body}\\n" > "$out" && chmod +x "$out"\n')
    cc.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _cpuinfo(tmp_path: Path, text: str) -> dict[str, str]:
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    return {"MAGNITUDE_CPUINFO": str(f)}


def test_a_cpu_without_amx_needs_no_flags(tmp_path):
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, NO_AMX_LISTED) | _fake_cc(tmp_path, "exit 132"))
    assert out.returncode == 0 and out.stdout.strip() == ""


def test_amx_listed_but_faulting_is_left_out_of_the_build(tmp_path):
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, LISTS_AMX) | _fake_cc(tmp_path, "exit 132"))
    assert out.returncode == 0 and out.stdout.strip() == NO_AMX


def test_amx_listed_and_working_is_kept(tmp_path):
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, LISTS_AMX) | _fake_cc(tmp_path, "exit 0"))
    assert out.returncode == 0 and out.stdout.strip() == ""


def test_native_avx512fp16_is_left_out_of_the_build(tmp_path):
    fp16 = "#define __AVX512F__ 1\\n#define __AVX512FP16__ 1\\n"
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, NO_AMX_LISTED) | _fake_cc(tmp_path, "exit 0", fp16))
    assert out.returncode == 0 and out.stdout.strip() == NO_FP16


def test_fp16_is_seen_under_pipefail_whatever_the_compiler_prints_after_it(tmp_path):
    """setup.sh runs with `set -o pipefail`: the answer must not depend on whether the compiler was
    still writing when the search found its macro."""
    many = "#define __AVX512FP16__ 1\\n" + "#define __FILLER_MACRO_PADDING_THE_OUTPUT__ 1\\n" * 3000
    env = _cpuinfo(tmp_path, NO_AMX_LISTED) | _fake_cc(tmp_path, "exit 0", many)
    for _ in range(3):
        out = _lib("set -o pipefail; extra_cpu_flags", env)
        assert out.returncode == 0 and out.stdout.strip() == NO_FP16


def test_both_left_out_name_the_cached_wheel(tmp_path):
    fp16 = "#define __AVX512FP16__ 1\\n"
    env = _cpuinfo(tmp_path, LISTS_AMX) | _fake_cc(tmp_path, "exit 132", fp16)
    out = _lib('f=$(extra_cpu_flags); echo "$f"; cpu_flags_tag "$f"; cpu_flags_tag ""', env)
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"{NO_AMX} {NO_FP16}", "-noamx-nofp16", ""]


def test_avx512f_without_fp16_needs_no_flags(tmp_path):
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, NO_AMX_LISTED)
               | _fake_cc(tmp_path, "exit 0", "#define __AVX512F__ 1\\n"))
    assert out.returncode == 0 and out.stdout.strip() == ""


def test_a_compiler_without_amx_needs_no_flags(tmp_path):
    """It builds no AMX kernels, and would refuse -mno-amx-tile."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cc").write_text("#!/bin/sh\necho 'unrecognized option -mamx-tile' >&2\nexit 1\n")
    (bin_dir / "cc").chmod(0o755)
    out = _lib("extra_cpu_flags", _cpuinfo(tmp_path, LISTS_AMX) | {"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0 and out.stdout.strip() == ""


def test_the_installed_builds_match_what_this_machine_runs():
    """On this machine: the wheel has AMX kernels only where the probe ran them, and both builds
    record the flags they were built with (a stale build is rebuilt, not reused)."""
    flags = _lib("extra_cpu_flags").stdout.strip()
    assert flags in ("", NO_AMX, NO_FP16, f"{NO_AMX} {NO_FP16}")
    wheel_has_amx = _lib("installed_llama_has_amx").returncode == 0
    if NO_AMX in flags:
        assert not wheel_has_amx, "setup.sh left a wheel with AMX kernels that this machine cannot run"
    stamp = Path(sys.prefix) / "llama-cpp-python.cpu_flags"
    if flags or stamp.exists():
        assert stamp.read_text().strip() == flags, "setup.sh left a wheel built with other CPU flags"
    found = llama_tools()
    if found is not None:
        stamp = dict(line.split("=", 1) for line in (found[0] / "BUILD-INFO").read_text().splitlines()
                     if "=" in line)
        assert stamp.get("cpu_flags", "") == flags
