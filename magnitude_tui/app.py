"""Provides the Textual app and `run_app`, the entry point the CLI calls."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Iterable

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from magnitude_tui.agents import AgentSettings, RoleBook
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.export import default_export_dir
from magnitude_tui.gc_pacing import GcPacer
from magnitude_tui.screens.palette import palette_commands
from magnitude_tui.screens.workspace import WorkspaceScreen
from magnitude_tui.store import Store
from magnitude_tui.workspace.pump import EventPump
from scheduler.types import SamplingParams
from themes import DEFAULT_THEME, THEMES

GC_TICK_S = 0.25  # how often the app asks whether a full garbage collection is due
# The terminal went away (SIGHUP: a closed window, a tmux kill, an ssh drop) or someone asked the
# app to stop (SIGTERM): it ends as ctrl+q does, so what it started stops with it.
EXIT_SIGNALS = (signal.SIGHUP, signal.SIGTERM) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


def available_themes() -> list[str]:
    """The theme names `--theme` accepts (ours first, then Textual's built-ins)."""
    from textual.theme import BUILTIN_THEMES

    return [t.name for t in THEMES] + [n for n in BUILTIN_THEMES if n != "textual-ansi"]


class MagnitudeApp(App):
    """Owns the engine client (any EngineClient: local worker, remote, scripted), its event pump
    and the store; the pump feeds the serve hub (under --serve) and the workspace screen, which
    does the rest."""

    CSS_PATH = "app.tcss"
    TITLE = "magnitude-tui"
    # Textual's own ctrl+q, shown in the footer: a new user should not have to guess how to leave.
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, *, client: EngineClient, store: Store, theme: str | None = None,
                 resume: bool = False, export_dir: Path | None = None,
                 sampling: SamplingParams | None = None, serve=None,
                 roles: RoleBook | dict[str, AgentSettings] | None = None,
                 workdir: Path | None = None) -> None:
        """`export_dir`: where f5 writes (default: `exports` in the data directory, beside the
        database). Deleting a conversation tells the engine to delete its saved KV (`forget`)."""
        super().__init__()
        self.workdir = workdir  # agents' workspace root (None: the current directory)
        self.serve = serve
        self.roles = roles if isinstance(roles, RoleBook) else RoleBook(None, roles or {})  # agents.toml
        self.failure: str | None = None  # why the engine is down (None while it runs or loads)
        self.sampling = sampling or SamplingParams()
        self.client = client
        self.pump = EventPump(client)  # the one reader of the engine's events
        self.store = store
        self._resume = resume
        self._export_dir = export_dir or default_export_dir()
        for t in THEMES:
            self.register_theme(t)
        self.gc_pacer = GcPacer()  # full garbage collections between keys, not during them
        self.signalled: signal.Signals | None = None  # SIGHUP or SIGTERM ended the app
        self._caught: list[signal.Signals] = []  # the signals whose handlers are ours
        wanted = theme or store.get_setting("theme") or DEFAULT_THEME
        self.theme = wanted if wanted in self.available_themes else DEFAULT_THEME

    @property
    def workspace(self) -> WorkspaceScreen:
        return self.get_screen("workspace")  # type: ignore[return-value]

    def on_mount(self) -> None:
        restored = self.store.open_workspace(resume=self._resume)
        if self.store.notice:
            self.notify(self.store.notice, title="Database", severity="warning", timeout=30)
        self.store.on_notice = lambda message: self.notify(message, title="Database", severity="warning", timeout=30)
        if self.serve is not None:
            self.pump.subscribe(self.serve.dispatch)  # first: HTTP replies wait on no screen
        self.install_screen(WorkspaceScreen(client=self.client, store=self.store,
                                            restored=restored, export_dir=self._export_dir,
                                            sampling=self.sampling, roles=self.roles,
                                            workdir=self.workdir),
                           "workspace")
        self.push_screen("workspace")  # it says PanesReady once its panes are mounted
        self._catch_exit_signals()
        self.call_after_refresh(self._pace_gc)  # the first frame is drawn: what is alive now stays

    @on(WorkspaceScreen.PanesReady)
    async def _start_engine(self, message: WorkspaceScreen.PanesReady) -> None:
        """Start the engine, its pump and the HTTP endpoint once the panes can take updates."""
        ws = message.workspace
        self.pump.subscribe(ws.link.inbox)
        self.client.start()
        self.run_worker(self.pump.run(), name="engine-events", exclusive=True)
        if self.serve is not None:
            ws.api_panes = self.serve.attach(ws)
            self.serve.start(self.notify)
        await ws.engine_started()

    def _pace_gc(self) -> None:
        self.gc_pacer.start()
        self.set_interval(GC_TICK_S, self._collect_between_keys)

    def _collect_between_keys(self) -> None:
        # At exit Textual clears the installed screens before this interval stops; a tick then
        # has no workspace to ask about keys, and a collection is of no use.
        if not self.is_screen_installed("workspace"):
            return
        pane = self.workspace.grid.focused_pane() if self.workspace.is_mounted else None
        self.gc_pacer.tick(pane.composer.typed_at if pane is not None else -1.0)

    def watch_theme(self, theme: str) -> None:
        self.store.set_setting("theme", theme)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, WorkspaceScreen):
            yield from palette_commands(screen)

    def _catch_exit_signals(self) -> None:
        """SIGHUP and SIGTERM end the app as ctrl+q does. They used to kill it outright: an agent's
        approved command, in a process group of its own that the signal does not reach, ran on
        and wrote after the app was gone, and the unmount (the last store save, the MCP servers)
        never ran. A second signal ends the process at once."""
        loop = asyncio.get_running_loop()
        for sig in EXIT_SIGNALS:
            try:
                loop.add_signal_handler(sig, self._exit_on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no such handler here (not the main thread)
                continue
            self._caught.append(sig)

    def _exit_on_signal(self, sig: signal.Signals) -> None:
        if self.signalled is not None:  # asked twice: no more waiting for the clean exit
            self._release_exit_signals()
            os.kill(os.getpid(), sig)
            return
        self.signalled = sig
        self.exit(return_code=128 + sig)

    def _release_exit_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._caught:
            loop.remove_signal_handler(sig)
        self._caught = []

    def on_unmount(self) -> None:
        self._release_exit_signals()
        self.gc_pacer.stop()
        self.client.stop()

    @on(WorkspaceScreen.EngineStatus)
    def _engine_status(self, message: WorkspaceScreen.EngineStatus) -> None:
        # The first failure carries the reason (a load error); the worker's exit comes after it.
        if message.reason is None or self.failure is None:
            self.failure = message.reason

    async def action_quit(self) -> None:
        # Quitting while the engine is down is how a failed start ends: the exit code says so.
        self.exit(return_code=1 if self.failure else 0)


def run_app(engine: EngineConfig | EngineClient, *, theme: str | None, resume: bool,
            sampling: SamplingParams | None = None, serve_port: int | None = None,
            serve_host: str = "127.0.0.1", api_key: str | None = None,
            roles: RoleBook | dict[str, AgentSettings] | None = None,
            export_dir: Path | None = None, workdir: Path | None = None) -> str | None:
    """Run the TUI until the user quits: a local engine (its worker in its own process) or a
    remote client, state in SQLite; with `serve_port`, the OpenAI-compatible endpoint too.

    Returns why the engine was down when the user quit (None if it was running); ended by SIGHUP
    or SIGTERM, it exits 128 + the signal (SystemExit) once the engine is stopped."""
    from magnitude_tui.engine.client import WorkerClient

    if theme is not None and theme not in available_themes():
        raise ValueError(f"unknown theme {theme!r}; choose from {', '.join(available_themes())}")
    store = Store()  # StoreError (a newer schema, a locked file) reaches the CLI's message
    client = WorkerClient(engine) if isinstance(engine, EngineConfig) else engine
    serve = None
    if serve_port is not None:
        from magnitude_tui.serve.app import ServeOptions
        from magnitude_tui.serve.server import EmbeddedServer, served_model_name

        serve = EmbeddedServer(client, host=serve_host, port=serve_port,
                               options=ServeOptions(model_name=served_model_name(client), api_key=api_key))
    app = MagnitudeApp(client=client, store=store, theme=theme, resume=resume, sampling=sampling,
                       serve=serve, roles=roles, export_dir=export_dir,
                       workdir=workdir)
    try:
        app.run()
        if app.signalled is not None:
            raise SystemExit(128 + app.signalled)
        if app.return_code and app.failure is None:  # a crash: Textual printed its traceback above
            return "the app stopped on an unexpected error (its traceback is above)"
        return app.failure
    finally:
        client.stop()
        store.close()
