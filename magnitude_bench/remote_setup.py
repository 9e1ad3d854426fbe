"""`bench remote`'s engines from its options: the server (a --url, or the vendored llama-server that
--llama-server starts on the local engine's model and threads) and, with --local, the local engine.

Errors name the option at fault (`typer.BadParameter`); the bench itself is in `remote.py`."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import typer

from magnitude_bench.options import naming


def _n_ctx(widths: tuple[int, ...], gen: int) -> int:
    return max(8192, max(widths) * (gen + 128))


@contextlib.contextmanager
def remote_engines(url: list[str], llama_server: int, *, widths: tuple[int, ...], gen: int,
                   remote_model: Optional[str], local: bool, model: Optional[str], device: str,
                   threads: Optional[int]) -> Iterator[dict]:
    """{"remote": client[, "local": client]} for as long as the block runs (a started server with it)."""
    if bool(url) == bool(llama_server):
        raise typer.BadParameter("give either --url (a running server) or --llama-server N (start one)",
                                 param_hint="--url")
    with contextlib.ExitStack() as stack:
        if llama_server:
            url = [stack.enter_context(_vendored_llama_server(llama_server, model, device, threads, widths, gen)).url]
        yield _engines(url, widths, gen, remote_model, local, model, device, threads)


@contextlib.contextmanager
def _vendored_llama_server(slots: int, model: Optional[str], device: str, threads: Optional[int],
                           widths: tuple[int, ...], gen: int):
    """llama-server -np `slots` on the model and thread count the local engine would use."""
    from backend import usable_cpus
    from magnitude_bench.peers import PeerError, Server, model_path, tools_dir

    if device != "cpu":
        raise typer.BadParameter("--llama-server starts a CPU peer (use --device cpu); for a GPU, start "
                                 "llama-server with its -dev flag and give --url", param_hint="--llama-server")
    found = tools_dir()
    if found is None:
        raise typer.BadParameter("llama-server is not built: run `bash scripts/build_llama_tools.sh`",
                                 param_hint="--llama-server")
    server = Server.on_cpu(found[0], model=model_path(model), parallel=slots,
                           threads=threads or usable_cpus(), n_ctx=_n_ctx(widths, gen))
    with naming("--llama-server", PeerError), server:
        yield server.process


def _engines(url: list[str], widths: tuple[int, ...], gen: int, remote_model: Optional[str], local: bool,
             model: Optional[str], device: str, threads: Optional[int]) -> dict:
    from magnitude_tui.engine.protocol import EngineClient
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig

    engines: dict[str, EngineClient]
    with naming("--url"):
        engines = {"remote": RemoteClient(RemoteConfig(tuple(url), model=remote_model, max_in_flight=max(widths)))}
    if local:
        from backend.factory import BackendConfig
        from magnitude_tui.engine.client import WorkerClient
        from magnitude_tui.engine.events import EngineConfig

        backend = BackendConfig("llama", model=model, device=device, n_threads=threads,
                                n_ctx=_n_ctx(widths, gen), n_seq_max=max(16, max(widths)))
        engines["local"] = WorkerClient(EngineConfig(backend))
    return engines
