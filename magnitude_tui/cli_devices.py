"""Provides `magnitude-tui devices`: the devices llama.cpp sees, and with --attention the attention
path the model runs on one of them."""

from __future__ import annotations

from typing import Optional

import typer

from magnitude_tui.cli_options import DeviceOpt, ModelOpt, VerboseOpt, fail

commands = typer.Typer()


@commands.command()
def devices(
    verbose: bool = VerboseOpt,
    attention: bool = typer.Option(False, "--attention", metavar=" ", help="Also load the model on --device and say which "
                                   "attention path it runs and why (measured once, then cached)."),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    threads: Optional[int] = typer.Option(None, "--threads", help="Engine CPU threads the choice is for "
                                          "(default: as the app: all cores but one)."),
) -> None:
    """List the devices this llama.cpp build sees (name, type, memory)."""
    from rich.console import Console
    from rich.table import Table

    from backend import native
    from magnitude_tui import preflight

    if attention:  # checked before the table: a bad --device was a DeviceError traceback after it
        try:
            model = preflight.check_model(model)
            preflight.check_device(device)
            preflight.check_numbers(n_ctx=None, threads=threads)
        except preflight.OptionError as exc:
            fail(str(exc))
    native.init(verbose)
    table = Table(title="devices (ggml backend registry)")
    for col in ("#", "name", "backend", "type", "memory free / total", "description"):
        table.add_column(col)
    for d in native.list_devices():
        mem = f"{d.memory_free / 2**30:.1f} / {d.memory_total / 2**30:.1f} GiB" if d.memory_total else "-"
        table.add_row(str(d.index), d.name, d.backend, d.kind, mem, d.description)
    console = Console()
    console.print(table)
    console.print(f"compiled backends: {', '.join(native.compiled_backends())}")
    if "Vulkan" in native.compiled_backends() and not any(d.backend == "Vulkan" for d in native.list_devices()):
        console.print("[dim]no Vulkan device visible; for the CPU Vulkan driver (lavapipe) set GGML_VK_VISIBLE_DEVICES=0[/]")
    if attention:
        from backend import usable_cpus
        from backend.attention import POOL_CHUNK
        from backend.factory import BackendConfig, build_backend

        # The app's default context: the probe's pool, and so the verdict's cache key, follow it.
        backend = build_backend(BackendConfig("llama", model=model, device=device, verbose=verbose,
                                              n_threads=threads or max(1, usable_cpus() - 1)))
        try:
            choice = backend.attention
            assert choice is not None  # a llama.cpp backend has measured or been told its path
            console.print(f"attention on {backend.device_name}, {backend.n_threads} thread(s): "
                          f"{choice.summary()}{' (cached)' if choice.cached else ''}")
            for t in choice.timings:
                console.print(f"  flash {'on ' if t.flash else 'off'}: fill {t.fill_ms:.0f} ms, decode step "
                              f"{t.decode_shallow_ms:.1f} ms shallow / {t.decode_deep_ms:.1f} ms deep, "
                              f"16-row chunk deep {t.chunk_deep_ms:.1f} ms"
                              + (f", beside {t.pool} other conversations: {POOL_CHUNK}-row chunk "
                                 f"{t.chunk_pool_ms:.1f} ms, decode step {t.decode_pool_ms:.1f} ms" if t.pool else ""))
        finally:
            backend.close()
