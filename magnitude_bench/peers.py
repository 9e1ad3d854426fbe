"""Provides the throughput peers: llama.cpp's llama-batched-bench and llama-server, and serial high-level Llama."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

from magnitude_tui.local_server import ServerProcess, ServerStartError, free_port

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TOOLS = ("llama-batched-bench", "llama-server")


class PeerError(RuntimeError):
    """A peer could not run (tool missing, server did not start); the message says what to do."""


def tools_dir() -> tuple[Path, str] | None:
    """Where scripts/build_llama_tools.sh put the tools: $MAGNITUDE_LLAMA_TOOLS, else the cache dir of
    the installed llama-cpp-python's variant (then the other variant). Returns (bin dir, variant)."""
    env = os.environ.get("MAGNITUDE_LLAMA_TOOLS")
    if env:
        d = Path(env)
        return (d, _stamp(d).get("variant", "?")) if all((d / t).exists() for t in TOOLS) else None
    root = Path(os.environ.get("MAGNITUDE_TOOLS_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "magnitude-tui" / "llama-tools")
    for variant in _variant_preference():
        d = root / f"{LLAMA_CPP_PYTHON_VERSION}-{variant}" / "bin"
        if all((d / t).exists() for t in TOOLS):
            return d, variant
    return None


def required_tools(what: str = "llama.cpp's tools") -> Path:
    """tools_dir's bin dir, or PeerError saying how to build it (`what`: the tool the caller needs)."""
    found = tools_dir()
    if found is None:
        raise PeerError(f"{what} is not built: run scripts/build_llama_tools.sh")
    return found[0]


def model_path(model: str | None) -> str:
    """The GGUF a peer runs: `model`, else the app's default model."""
    from backend.llama_load import default_model_path

    return model or default_model_path()


def _variant_preference() -> list[str]:
    try:
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        first = "vulkan" if any(lib.glob("libggml-vulkan*")) else "cpu"
    except ImportError:
        first = "vulkan"
    return [first, "cpu" if first == "vulkan" else "vulkan"]


def _stamp(d: Path) -> dict:
    try:
        return dict(line.split("=", 1) for line in (d / "BUILD-INFO").read_text().splitlines() if "=" in line)
    except OSError:
        return {}


def tool_info(d: Path) -> dict:
    info = _stamp(d)
    with suppress(OSError, IndexError):
        info["version"] = (d / "version.txt").read_text().strip().splitlines()[-1]
    return info


def device_args(device_name: str) -> list[str]:
    """The llama.cpp tool flags for the device the engine's backend runs on."""
    if device_name.upper().startswith("CPU"):
        return ["-dev", "none", "-ngl", "0"]
    return ["-dev", device_name.split()[0], "-ngl", "999"]


# ---- llama-batched-bench -------------------------------------------------------------------------

def batched_bench(bindir: Path, *, model: str, seqs: list[int], prompt: int, gen: int, threads: int,
                  n_ctx: int, n_batch: int, n_ubatch: int, dev: list[str],
                  extra: list[str] | None = None, timeout_s: float = 3600, unified: bool = True) -> dict[int, dict]:
    """One llama-batched-bench run over every batch width; {seqs: its JSON line}. `extra`: more
    flags (e.g. -pps for a prompt shared by every sequence, -fa on|off). `unified`: one KV cache
    for every sequence (-kvu, as the engine runs), else a cache stream per sequence, each
    n_ctx / sequences cells. subprocess.TimeoutExpired after `timeout_s`."""
    cmd = [str(bindir / "llama-batched-bench"), "-m", model, "-c", str(n_ctx), "-b", str(n_batch),
           "-ub", str(n_ubatch), "-t", str(threads), "-tb", str(threads), *(["-kvu"] if unified else []), *dev,
           "-npp", str(prompt), "-ntg", str(gen), "-npl", ",".join(map(str, seqs)), "--output-format", "jsonl", *(extra or [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise PeerError(f"llama-batched-bench failed ({proc.returncode}): {proc.stderr[-800:]}")
    out = {}
    for line in (proc.stdout + "\n" + proc.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            out[int(row["pl"])] = row
    if not out:
        raise PeerError(f"llama-batched-bench printed no results: {proc.stderr[-800:]}")
    return out


# ---- llama-server --parallel N ------------------------------------------------------------------

class Server:
    """llama-server on 127.0.0.1 with N slots (continuous batching), stopped on exit."""

    def __init__(self, bindir: Path, *, model: str, parallel: int, threads: int, n_ctx: int, n_batch: int,
                 n_ubatch: int, dev: list[str], extra: list[str] | None = None) -> None:
        self.port = free_port()
        cmd = [str(bindir / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(parallel), "-cb", "-kvu", "-c", str(n_ctx), "-b", str(n_batch), "-ub", str(n_ubatch),
               "-t", str(threads), "-tb", str(threads), *dev, "--no-webui", "-cram", "0", *(extra or [])]
        self.process = ServerProcess(cmd, self.port, "llama-server")

    @classmethod
    def on_cpu(cls, bindir: Path, *, model: str, parallel: int, threads: int, n_ctx: int,
               extra: list[str] | None = None) -> "Server":
        """The CPU peer the HTTP benches compare with: llama-server's default batch sizes."""
        return cls(bindir, model=model, parallel=parallel, threads=threads, n_ctx=n_ctx, n_batch=2048,
                   n_ubatch=512, dev=device_args("CPU"), extra=extra)

    @property
    def cmd(self) -> list[str]:
        return self.process.cmd

    @property
    def pid(self) -> int | None:
        return self.process.proc.pid if self.process.proc is not None else None

    def __enter__(self) -> "Server":
        try:
            self.process.__enter__()
        except ServerStartError as e:
            raise PeerError(str(e)) from None
        return self

    def __exit__(self, *exc) -> None:
        self.process.__exit__(*exc)

    def complete(self, tokens: list[int], n_predict: int, **fields: Any) -> dict:
        """One greedy /completion; `fields` override the body's (ignore_eos, cache_prompt ...)."""
        body = json.dumps({"prompt": tokens, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
                           "cache_prompt": False, "stream": False, **fields}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1800) as r:
            return json.loads(r.read())

    def replies(self, prompts: list[list[int]], n_predict: int, **fields: Any) -> list[dict]:
        """All prompts at once, one connection each (`complete`'s `fields`); their replies."""
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: self.complete(p, n_predict, **fields), prompts))

    def warm(self, prompt: list[int]) -> None:
        """Its first-call costs paid on one prompt (4 tokens), before anything is timed."""
        self.burst([prompt], 4)

    def burst(self, prompts: list[list[int]], n_predict: int) -> tuple[float, int]:
        """`replies` to the prompts; (wall seconds, tokens generated)."""
        t0 = time.perf_counter()
        replies = self.replies(prompts, n_predict)
        return time.perf_counter() - t0, sum(int(r.get("tokens_predicted", 0)) for r in replies)


# ---- llama-cpp-python's high-level Llama, one request at a time ---------------------------------

class SerialLlama:
    """The high-level `llama_cpp.Llama` answering requests one after another (greedy, fixed length)."""

    def __init__(self, *, model: str, threads: int, n_ctx: int, n_batch: int, n_ubatch: int, cpu: bool) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads,
                         n_threads_batch=threads, n_gpu_layers=0 if cpu else -1, verbose=False)

    def answer(self, tokens: list[int], n: int) -> int:
        # Llama.generate is the token loop create_completion runs; it never stops on its own, so
        # the request makes exactly n tokens (create_completion would stop at <|im_end|>).
        made = 0
        for _ in self.llm.generate(tokens, temp=0.0, top_k=1, repeat_penalty=1.0):
            made += 1
            if made >= n:
                break
        return made

    def serial(self, prompts: list[list[int]], n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        made = sum(self.answer(p, n) for p in prompts)
        return time.perf_counter() - t0, made

    def close(self) -> None:
        self.llm.close()
