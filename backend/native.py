"""Provides the loaded llama.cpp/ggml libraries, native log control and the ggml device registry."""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

import llama_cpp

_DEV_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
_lock = threading.Lock()
_ggml = None
_log_cb = None  # the ctypes callback must outlive every native call that may log
_verbose = False
_initialized = False


def ggml() -> ctypes.CDLL:
    """libggml, already loaded by llama_cpp; dlsym on it also finds libggml-base's symbols."""
    global _ggml
    with _lock:
        if _ggml is None:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml.so"))
            vp, sz = ctypes.c_void_p, ctypes.c_size_t
            for name, args, res in [
                ("ggml_backend_dev_count", [], sz),
                ("ggml_backend_dev_get", [sz], vp),
                ("ggml_backend_dev_name", [vp], ctypes.c_char_p),
                ("ggml_backend_dev_description", [vp], ctypes.c_char_p),
                ("ggml_backend_dev_type", [vp], ctypes.c_int),
                ("ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
                ("ggml_backend_dev_backend_reg", [vp], vp),
                ("ggml_backend_reg_name", [vp], ctypes.c_char_p),
                ("ggml_backend_reg_count", [], sz),
                ("ggml_backend_reg_get", [sz], vp),
            ]:
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, res
            _ggml = lib
    return _ggml


# ggml_log_level in the bundled ggml.h. CONT continues the previous line at that line's level.
LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = 1, 2, 3, 4, 5
_last_level = LOG_INFO


def log_shown(level: int, previous: int, verbose: bool) -> tuple[bool, int]:
    """Whether a native log line is written, and the level it counts as (a CONT line continues
    `previous`). Errors always reach stderr (the worker's log file); the rest only when verbose."""
    effective = previous if level == LOG_CONT else level
    return verbose or effective == LOG_ERROR, effective


def init(verbose: bool = False) -> None:
    """Initialise llama.cpp once per process and route its logs (quiet unless verbose)."""
    global _log_cb, _verbose, _initialized
    _verbose = verbose
    if _log_cb is None:

        @llama_cpp.llama_log_callback
        def _cb(level, text, _user):  # noqa: ANN001 - ctypes signature
            global _last_level
            shown, _last_level = log_shown(level, _last_level, _verbose)
            if shown:
                os.write(2, text or b"")

        _log_cb = _cb
        llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
    if not _initialized:
        llama_cpp.llama_backend_init()
        _initialized = True


@dataclass(frozen=True)
class Device:
    index: int  # position in the ggml device registry
    name: str  # e.g. "Vulkan0", "CPU"
    description: str
    kind: str  # cpu | gpu | igpu | accel
    backend: str  # registry name: "CPU", "Vulkan"
    memory_free: int
    memory_total: int
    handle: int  # ggml_backend_dev_t


def list_devices() -> list[Device]:
    """The devices this build sees. Vulkan skips CPU-type drivers (lavapipe) unless
    GGML_VK_VISIBLE_DEVICES names them; set it before the first call in the process."""
    init(_verbose)
    lib = ggml()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        out.append(Device(
            index=i,
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
            kind=_DEV_TYPES.get(lib.ggml_backend_dev_type(dev), "?"),
            backend=(lib.ggml_backend_reg_name(reg) or b"").decode() if reg else "",
            memory_free=free.value,
            memory_total=total.value,
            handle=dev,
        ))
    return out


def compiled_backends() -> list[str]:
    """Registry names compiled into this build (e.g. ["Vulkan", "CPU"]), with or without devices."""
    init(_verbose)
    lib = ggml()
    return [(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode()
            for i in range(lib.ggml_backend_reg_count())]


class DeviceError(ValueError):
    """The requested device does not exist in this build or on this machine."""


def select_device(spec: str) -> Device | None:
    """Resolve `auto | cpu | vulkan | vulkan:N` to a device; None means the CPU backend."""
    spec = (spec or "auto").strip().lower()
    if spec == "cpu":
        return None
    vulkan = [d for d in list_devices() if d.backend.lower() == "vulkan"]
    if spec == "auto":
        gpus = [d for d in vulkan if d.kind in ("gpu", "igpu")]
        return gpus[0] if gpus else None
    if spec == "vulkan" or spec.startswith("vulkan:"):
        if "Vulkan" not in compiled_backends():
            raise DeviceError("this llama-cpp-python build has no Vulkan backend; rebuild with scripts/setup.sh")
        if not vulkan:
            raise DeviceError(
                "no Vulkan device is visible. A CPU Vulkan driver (lavapipe) is hidden by default: "
                "install mesa-vulkan-drivers and set GGML_VK_VISIBLE_DEVICES=0 to use it"
            )
        n = 0
        if ":" in spec:
            try:
                n = int(spec.split(":", 1)[1])
            except ValueError:
                raise DeviceError(f"bad device {spec!r}: use vulkan:N with N a number") from None
        if not 0 <= n < len(vulkan):
            raise DeviceError(f"no device vulkan:{n}; this machine has {len(vulkan)} Vulkan device(s)")
        return vulkan[n]
    raise DeviceError(f"unknown device {spec!r}: use auto, cpu, vulkan or vulkan:N")
