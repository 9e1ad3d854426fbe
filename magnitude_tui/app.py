"""Provides the Textual app and `run_app`, the entry point the CLI calls."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from magnitude_tui.agents import AgentSettings
from magnitude_tui.commands import palette_commands
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.screens.workspace import WorkspaceScreen
from magnitude_tui.store import Store
from scheduler.types import SamplingParams
from themes import DEFAULT_THEME, THEMES


# Python's cyclic collector, left at its defaults, walks every object the app holds (Textual's
# widgets, styles, caches: hundreds of thousands) in each full collection: a pause of 100+ ms that
# lands on whatever key is waiting for its frame. Once the workspace is up, what exists then is
# moved out of the collector's sight (gc.freeze: it lives as long as the app), and the young
# generation is collected less often (a frame makes tens of thousands of short-lived strips and
# segments, nearly all freed by reference counting, not by the collector).
GC_THRESHOLDS = (10_000, 10, 10)


def tame_gc() -> tuple[int, ...]:
    """Freeze what exists now out of the cyclic collector's walks and space its collections;
    returns the thresholds before (`untame_gc` puts them back)."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return before


def untame_gc(thresholds: tuple[int, ...]) -> None:
    gc.unfreeze()  # what was frozen is the collector's again (the app is gone)
    gc.set_threshold(*thresholds)


def available_themes() -> list[str]:
    """The theme names `--theme` accepts (ours first, then Textual's built-ins)."""
    from textual.theme import BUILTIN_THEMES

    return [t.name for t in THEMES] + [n for n in BUILTIN_THEMES if n != "textual-ansi"]


class MagnitudeApp(App):
    """Owns the engine client (any EngineClient: local worker, remote, scripted) and the store;
    the workspace screen does the rest."""

    CSS_PATH = "app.tcss"
    TITLE = "magnitude-tui"
    # Textual's own ctrl+q, shown in the footer: a new user should not have to guess how to leave.
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]

    def __init__(self, *, client: EngineClient, store: Store, theme: str | None = None,
                 resume: bool = False, export_dir: Path | None = None,
                 sampling: SamplingParams | None = None, serve=None,
                 roles: dict[str, AgentSettings] | None = None, warm_dir: Path | None = None) -> None:
        """`warm_dir`: where the engine saves conversations' KV (deleting a conversation deletes
        its files there too)."""
        super().__init__()
        self.warm_dir = warm_dir
        self.serve = serve
        self.roles = roles or {}  # named agent definitions (agents.toml)
        self.failure: str | None = None  # why the engine is down (None while it runs or loads)
        self.sampling = sampling or SamplingParams()
        self.client = client
        self.store = store
        self._resume = resume
        self._export_dir = export_dir or Path.cwd()
        self._gc_thresholds: tuple[int, ...] | None = None  # the collector's, while the app tamed it
        for t in THEMES:
            self.register_theme(t)
        wanted = theme or store.get_setting("theme") or DEFAULT_THEME
        self.theme = wanted if wanted in self.available_themes else DEFAULT_THEME

    @property
    def workspace(self) -> WorkspaceScreen:
        return self.get_screen("workspace")  # type: ignore[return-value]

    def on_mount(self) -> None:
        restored = self.store.open_workspace(resume=self._resume)
        if self.store.notice:
            self.notify(self.store.notice, title="Database", severity="warning", timeout=30)
        self.install_screen(WorkspaceScreen(client=self.client, store=self.store,
                                            restored=restored, export_dir=self._export_dir,
                                            sampling=self.sampling, serve=self.serve, roles=self.roles),
                           "workspace")
        self.push_screen("workspace")  # it starts the engine once its panes are mounted
        self.call_after_refresh(self._tame_gc)  # the first frame is drawn: what is alive now stays

    def _tame_gc(self) -> None:
        self._gc_thresholds = tame_gc()

    def watch_theme(self, theme: str) -> None:
        self.store.set_setting("theme", theme)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(screen, WorkspaceScreen):
            yield from palette_commands(screen)

    def on_unmount(self) -> None:
        self.client.stop()
        if self._gc_thresholds is not None:
            untame_gc(self._gc_thresholds)

    def engine_failed(self, reason: str | None) -> None:
        """The workspace reports the engine down (with why) or up again (None)."""
        self.failure = reason

    async def action_quit(self) -> None:
        # Quitting while the engine is down is how a failed start ends: the exit code says so.
        self.exit(return_code=1 if self.failure else 0)


def run_app(engine: EngineConfig | EngineClient, *, theme: str | None, resume: bool,
            sampling: SamplingParams | None = None, serve_port: int | None = None,
            serve_host: str = "127.0.0.1", api_key: str | None = None,
            roles: dict[str, AgentSettings] | None = None) -> str | None:
    """Run the TUI until the user quits: a local engine (its worker in its own process) or a
    remote client, state in SQLite; with `serve_port`, the OpenAI-compatible endpoint too.

    Returns why the engine was down when the user quit (None if it was running)."""
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
    warm_dir = Path(engine.warm_dir) if isinstance(engine, EngineConfig) and engine.warm_dir else None
    app = MagnitudeApp(client=client, store=store, theme=theme, resume=resume, sampling=sampling,
                       serve=serve, roles=roles, warm_dir=warm_dir)
    try:
        app.run()
        return app.failure
    finally:
        client.stop()
        store.close()
