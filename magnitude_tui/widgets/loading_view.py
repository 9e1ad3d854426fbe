"""Provides the loading view: model, device and a progress bar driven by llama.cpp's load callback."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Center, Middle, Vertical
from textual.widgets import ProgressBar, Static

from magnitude_tui.engine.events import EngineFailed, LoadProgress


class LoadingView(Middle):
    """Shown above the panes until the engine reports ready (or failed)."""

    DEFAULT_CSS = """
    LoadingView { background: $background; height: auto; }
    LoadingView > Center { height: auto; }
    LoadingView #loading-box { width: 64; height: auto; padding: 1 2; border: round $primary;
                               background: $surface; }
    LoadingView .title { text-style: bold; color: $primary; width: 1fr; content-align: center middle; }
    LoadingView .detail { color: $text-muted; }
    LoadingView ProgressBar { width: 1fr; margin: 1 0; }
    LoadingView ProgressBar Bar { width: 1fr; }
    LoadingView .error { color: $error; text-style: bold; }
    LoadingView.-failed #loading-box { border: round $error; }
    """

    def __init__(self, model: str | None, device: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._model = model or "default model (SmolLM2-135M-Instruct)"
        self._device = device

    def compose(self) -> ComposeResult:
        with Center():
            with Vertical(id="loading-box"):
                yield Static("magnitude-tui", classes="title")
                yield Static(self._detail_text(), classes="detail", id="loading-detail", markup=False)
                yield ProgressBar(total=100, show_eta=False, id="loading-bar")
                yield Static("starting the engine worker…", id="loading-status", markup=False)

    def _detail_text(self) -> str:
        return f"model   {self._model}\ndevice  {self._device}"

    def progress(self, event: LoadProgress) -> None:
        self._model, self._device = event.model or self._model, event.device or self._device
        self.query_one("#loading-detail", Static).update(self._detail_text())
        self.query_one(ProgressBar).update(progress=round(event.fraction * 100, 1))
        self.query_one("#loading-status", Static).update(event.stage)

    def failed(self, event: EngineFailed) -> None:
        """Show why the engine could not start. The first failure is the reason (a load error);
        the news that the worker process then exited adds nothing and is not shown over it."""
        if self.has_class("-failed"):
            return
        self.add_class("-failed")
        status = self.query_one("#loading-status", Static)
        status.add_class("error")
        hint = "ctrl+r restarts the engine · ctrl+q quits" if event.restartable else "ctrl+q quits"
        status.update(f"{event.message}\n{hint}")

    def restarting(self) -> None:
        self.remove_class("-failed")
        status = self.query_one("#loading-status", Static)
        status.remove_class("error")
        status.update("restarting the engine worker…")
        self.query_one(ProgressBar).update(progress=0)
