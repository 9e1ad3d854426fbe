"""Provides a pane's status line: phase badge, prefill progress, queue time, TTFT, tok/s, ITL p95."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import ProgressBar, Static

from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.widgets.format import fmt_count, fmt_ms, fmt_rate
from magnitude_tui.widgets.tool_block import ToolActivity
from scheduler.types import DoneReason, Phase

_BADGE = {
    Phase.LOADING: "LOADING",
    Phase.QUEUED: "QUEUED",
    Phase.PREPARING: "PREPARING",
    Phase.PREFILL: "PREFILL",
    Phase.WAITING: "WAITING",
    Phase.GENERATING: "GENERATING",
    Phase.DONE: "DONE",
}


# Narrow panes (9 or more on a 120-column terminal) get short badges and only the figures that fit
# whole: a figure cut in the middle ("20.4 tok…") reads as a different number.
COMPACT_WIDTH = 48  # columns of the status line below which it is compact (two panes side by side)
_SHORT_BADGE = {
    Phase.LOADING: "LOAD",
    Phase.QUEUED: "QUEUE",
    Phase.PREPARING: "PREP",
    Phase.PREFILL: "PRE",
    Phase.WAITING: "WAIT",
    Phase.GENERATING: "GEN",
    Phase.DONE: "DONE",
}


# Phases with a prompt still to run, shown with the prefill bar. Not WAITING: a remote server's
# prefill is not visible, and an empty bar would invent a fraction.
_PROMPT_PHASES = (Phase.LOADING, Phase.QUEUED, Phase.PREPARING, Phase.PREFILL)


class StatusLine(Horizontal):
    """What the engine is doing for this pane's current (or last) request."""

    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; }
    StatusLine > .badge { width: auto; min-width: 8; padding: 0 1; text-style: bold;
                          background: $boost; color: $text-muted; }
    StatusLine > .badge.-loading, StatusLine > .badge.-queued, StatusLine > .badge.-waiting {
        background: $secondary; color: $text; }
    StatusLine > .badge.-preparing, StatusLine > .badge.-prefill { background: $warning; color: $background; }
    StatusLine > .badge.-generating { background: $primary; color: $background; }
    StatusLine > .badge.-tool { background: $accent; color: $background; }
    StatusLine > .badge.-done { background: $success; color: $background; }
    StatusLine > .badge.-cancelled { background: $panel-lighten-2; color: $text; }
    StatusLine > .badge.-error { background: $error; color: $background; }
    StatusLine > ProgressBar { width: auto; padding: 0 0 0 1; }
    StatusLine > ProgressBar Bar { width: 10; }
    StatusLine > .metrics { width: 1fr; padding: 0 1; color: $text-muted; text-wrap: nowrap;
                            text-overflow: ellipsis; }
    StatusLine.-compact > .badge { min-width: 0; }
    StatusLine.-compact > .metrics { padding: 0 0 0 1; }
    """

    def compose(self) -> ComposeResult:
        self._shown: tuple = ()  # what the widgets show now: (badge class, badge text, bar, metrics)
        self._update: SeqUpdate | None = None  # the update shown (a resize shows it again)
        self._activity: ToolActivity | None = None
        yield Static("IDLE", classes="badge")
        yield ProgressBar(total=1, show_eta=False, show_percentage=False)
        yield Figures("", classes="metrics", markup=False)

    def show(self, update: SeqUpdate | None, activity: ToolActivity | None = None) -> None:
        """Render the latest update (called on the paint tick, not per event).

        Only what changed is touched: the badge (its width follows its text, so it lays out
        again) changes with the phase; the metrics line has a fixed width and is only repainted.
        """
        if not self.query(".badge"):  # not composed yet, or torn down as the app closes
            return
        self._update = update
        self._activity = activity
        compact = 0 < self.size.width < COMPACT_WIDTH
        self.set_class(compact, "-compact")
        badge_class, badge_text = self._badge_class(update), self._badge_text(update, short=compact)
        prefilling = update is not None and update.phase in _PROMPT_PHASES
        bar = ((update.prompt_total, update.prompt_done)
               if update is not None and prefilling and update.prompt_total else None)
        if activity is not None:  # an agent waits on a tool or on approval: the `tool` phase
            badge_class, badge_text, prefilling, bar = "-tool", "TOOL", False, None
            parts = [activity.label()]
        elif compact:
            # The bar's 11 columns go to the figures; the prompt's done/total says the same.
            prefilling, bar = False, None
            parts = self.compact_parts(update)
        else:
            parts = self.metrics_parts(update)
        metrics = tuple(parts)
        old = self._shown or (None, None, None, None, None)
        self._shown = (badge_class, badge_text, prefilling, bar, metrics)
        if (badge_class, badge_text) != old[:2]:
            badge = self.query_one(".badge", Static)
            badge.set_classes(["badge", badge_class])
            badge.update(badge_text)
        if prefilling != old[2]:
            self.query_one(ProgressBar).display = prefilling
        if bar is not None and bar != old[3]:
            self.query_one(ProgressBar).update(total=bar[0], progress=bar[1])
        if metrics != old[4]:
            self.query_one(Figures).show(parts)

    def on_resize(self, event: events.Resize) -> None:
        if self._shown and (0 < event.size.width < COMPACT_WIDTH) != self.has_class("-compact"):
            self.show(self._update, self._activity)

    @staticmethod
    def _badge_class(update: SeqUpdate | None) -> str:
        if update is None:
            return "-idle"
        if update.phase is Phase.DONE and update.done_reason in (DoneReason.CANCELLED, DoneReason.ERROR):
            return f"-{update.done_reason.value}"
        return f"-{update.phase.value}"

    @staticmethod
    def _badge_text(update: SeqUpdate | None, *, short: bool = False) -> str:
        if update is None:
            return "IDLE"
        if update.phase is Phase.DONE and update.done_reason is not None:
            reason = update.done_reason
            if short:
                return {DoneReason.STOP: "DONE", DoneReason.CANCELLED: "STOP",
                        DoneReason.ERROR: "ERR", DoneReason.LENGTH: "LEN"}.get(reason, "DONE")
            return f"DONE·{reason.value}"
        return (_SHORT_BADGE if short else _BADGE)[update.phase]

    @staticmethod
    def compact_parts(u: SeqUpdate | None) -> list[str]:
        """A narrow pane's figures: the rate first while generating (the figure people watch), the
        rest as in the full line; shown as far as they fit."""
        if u is None:
            return ["Enter sends", "/help"]
        return StatusLine.metrics_parts(u, rate_first=True)

    @staticmethod
    def metrics_text(u: SeqUpdate | None) -> str:
        """Every figure of the status line, most telling first."""
        return " · ".join(StatusLine.metrics_parts(u))

    @staticmethod
    def metrics_parts(u: SeqUpdate | None, *, rate_first: bool = False) -> list[str]:
        """Most telling figure first, so a narrow pane leaves out the least useful ones."""
        if u is None:
            return ["Enter sends", "/spawn N task", "Esc cancels"]
        if not u.prompt_total:
            prompt = None
        elif u.phase in (Phase.LOADING, Phase.QUEUED, Phase.PREPARING):
            # Not admitted yet: how much of the prompt is cached is only known at admission.
            prompt = f"{fmt_count(u.prompt_total)} prompt tokens"
        else:
            prompt = (f"{fmt_count(u.prompt_done)}/{fmt_count(u.prompt_total)} "
                      f"({fmt_count(u.cached_tokens)} cached)")
        rate = u.tok_s_live if u.phase is not Phase.DONE else u.tok_s
        latency = [f"TTFT {fmt_ms(u.ttft_ms)}", f"{fmt_rate(rate)} tok/s", f"ITL p95 {fmt_ms(u.itl_p95_ms)}"]
        if rate_first:
            latency[:2] = latency[1::-1]
        if u.phase is Phase.LOADING:
            return [f"model {round((u.load_fraction or 0.0) * 100)}% loaded", "runs when the engine is ready"]
        where = f"on {u.remote.endpoint}" if u.remote.endpoint else None
        if u.phase is Phase.WAITING:
            # A remote server's prefill cannot be seen from the client: say only what is known.
            parts = ["waiting for first token", where, f"queue {fmt_ms(u.queue_ms)}"]
        elif u.phase in _PROMPT_PHASES:
            parts = [u.waiting_reason if u.phase is Phase.QUEUED else None, prompt,
                     f"queue {fmt_ms(u.queue_ms)}"]
        else:
            count = f"{'~' if u.remote.tokens_estimated else ''}{u.generated} tok"
            server = None
            if u.remote.server_timings is not None:
                t = u.remote.server_timings
                server = (f"server: prompt {fmt_rate(t.prompt_tok_s)} tok/s, "
                          f"gen {fmt_rate(t.predicted_tok_s)} tok/s, {t.cache_n} cached")
            acceptance = u.spec.acceptance  # None until a draft token was verified
            spec = (f"{u.spec.tokens_per_step:.1f} tok/step, {round(100 * acceptance)}% of drafts accepted"
                    if acceptance is not None and u.spec.tokens_per_step is not None else None)
            parts = [u.error, *latency, spec, f"queue {fmt_ms(u.queue_ms)}", count, prompt, where, server]
        return [p for p in parts if p]


class Figures(Static):
    """The status line's figures: as many as fit its width, each whole (a figure cut in the
    middle, `20.4 tok…`, reads as another number); `content` keeps them all."""

    def show(self, parts: list[str]) -> None:
        self._parts = parts
        self.update(" · ".join(parts), layout=False)

    def render(self) -> Content:
        width = self.content_size.width
        parts = getattr(self, "_parts", None)
        if not parts or width <= 0:
            return Content(str(self.content))
        return Content(fit_parts(parts, width))


def fit_parts(parts: list[str], width: int) -> str:
    """The leading parts, joined by " · ", that fit in `width` columns whole (the first one is
    always shown, cut with an ellipsis only when it alone is too wide)."""
    shown = ""
    for part in parts:
        joined = f"{shown} · {part}" if shown else part
        if shown and len(joined) > width:
            break
        shown = joined
    return shown
