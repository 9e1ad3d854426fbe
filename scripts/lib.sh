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
