"""Provides the scheduler panel: step time against target, decode vs prefill rows, budget, CPU
threads, KV, queue; for a remote engine, its servers instead."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widget import Widget

from magnitude_tui.engine.events import EndpointsReport, SeqUpdate, StepReport
from magnitude_tui.widgets.format import fmt_ms, fmt_rate, spark
from scheduler.budget import parse_policy
from scheduler.stats import percentile
from scheduler.types import Phase

HISTORY = 120
REFRESH_S = 0.25
_LABEL = 8  # width of the left-hand labels


def policy_target_ms(policy: str) -> float | None:
    """The step time a target policy (target:MS, target-v1:MS) aims at; None for token-count
    policies and for text that is no policy."""
    try:
        return parse_policy(policy).target_ms
    except ValueError:
        return None


class SchedulerPanel(Widget):
    """What the scheduler did in recent steps; fed every step, repainted a few times a second."""

    COMPONENT_CLASSES = {"sched--label", "sched--ok", "sched--over", "sched--decode", "sched--prefill",
                         "sched--kv", "sched--dim"}
    DEFAULT_CSS = """
    SchedulerPanel { width: 44; height: 1fr; padding: 0 1; border-left: solid $primary 40%;
                     background: $surface; text-wrap: nowrap; text-overflow: ellipsis; }
    SchedulerPanel .sched--label { color: $text-muted; }
    SchedulerPanel .sched--ok { color: $success; }
    SchedulerPanel .sched--over { color: $error; }
    SchedulerPanel .sched--decode { color: $primary; }
    SchedulerPanel .sched--prefill { color: $warning; }
    SchedulerPanel .sched--kv { color: $accent; }
    SchedulerPanel .sched--dim { color: $text-disabled; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.steps: deque[StepReport] = deque(maxlen=HISTORY)
        self.policy = "—"
        self.spec = "off"  # the speculation mode; draft rows are shown unless it is off
        self.model = "loading"
        self.device = "—"
        self.attention: str | None = None  # the attention path the engine runs, and why
        self.stopped = False  # the engine died: nothing runs until it is restarted
        # The live tok/s of each generating sequence, as its pane shows it: the panel's rate is
        # their sum, so the two always agree, and it drops to nothing when no sequence generates.
        self.rates: dict[str, float] = {}
        self.endpoints: EndpointsReport | None = None  # a remote engine's servers
        self._dirty = True

    def on_mount(self) -> None:
        self.border_title = "scheduler"
        self.set_interval(REFRESH_S, self._repaint)

    def record(self, report: StepReport) -> None:
        self.steps.append(report)
        self.policy = report.policy
        self.spec = report.spec
        self.stopped = False
        for update in report.updates:
            self.track(update)
        self._dirty = True

    def track(self, update: SeqUpdate) -> None:
        """Keep the sequence's live rate while it generates; forget it once it is done."""
        if update.phase is Phase.GENERATING and update.tok_s_live is not None:
            self.rates[update.request_id] = update.tok_s_live
        elif update.phase is Phase.DONE:
            self.rates.pop(update.request_id, None)
        self._dirty = True

    def engine_stopped(self) -> None:
        """The engine died: no rate, no running sequences, until EngineReady comes again."""
        self.stopped = True
        self.rates.clear()
        self._dirty = True

    @property
    def rate(self) -> float | None:
        """Tokens per second over every generating sequence (None when none generates)."""
        return sum(self.rates.values()) if self.rates and not self.stopped else None

    def record_endpoints(self, report: EndpointsReport) -> None:
        self.endpoints = report
        self.border_title = "servers"
        self._dirty = True

    def set_policy(self, policy: str) -> None:
        self.policy = policy
        self._dirty = True

    def set_spec(self, spec: str) -> None:
        self.spec = spec
        self._dirty = True

    def set_engine(self, model: str, device: str, attention: str | None = None) -> None:
        self.model, self.device, self.attention = model, device, attention
        self._dirty = True

    def _repaint(self) -> None:
        if self._dirty and self.display:
            self._dirty = False
            self.refresh()

    def render(self) -> Text:
        s = self.get_component_rich_style
        width = max(8, self.content_size.width - _LABEL - 5)  # room for a 4-digit figure after a sparkline
        text = Text(no_wrap=True, overflow="ellipsis")

        def line(label: str, *parts: tuple[str, str]) -> None:
            text.append(f"{label:<{_LABEL}}", s("sched--label"))
            for chunk, style in parts:
                text.append(chunk, s(style) if style else "")
            text.append("\n")

        line("model", (self.model.removesuffix(".gguf"), ""))
        line("device", (self.device, ""))
        if self.attention:
            line("attn", (self.attention, "sched--dim"))
        if self.endpoints is not None:
            self._render_endpoints(line, self.endpoints)
            return text
        target = policy_target_ms(self.policy)
        line("policy", (self.policy, "sched--kv"))
        if not self.steps:
            line("", ("no steps yet", "sched--dim"))
            return text
        last = self.steps[-1]
        recent = list(self.steps)[-width:]
        times = [r.step_ms for r in recent]

        # Fixed scale: the target sits at mid-height, so a bar above the middle is over target.
        top = 2 * target if target else max(times)
        text.append(f"{'step':<{_LABEL}}", s("sched--label"))
        text.append(" " * (width - len(times)))
        for value, char in zip(times, spark(times, len(times), top=top)):
            text.append(char, s("sched--over" if target and value > target else "sched--ok"))
        text.append("\n")
        line("", (f"last {fmt_ms(last.step_ms)}", ""),
             (f" vs target {fmt_ms(target)}" if target else "", "sched--dim"))
        line("", (f"p50 {fmt_ms(percentile(times, 50))} · p95 {fmt_ms(percentile(times, 95))}", ""))

        rows_top = max([r.decode_rows + r.prefill_rows + r.draft_rows for r in recent] + [1])
        line("decode", (spark([r.decode_rows for r in recent], width, top=rows_top), "sched--decode"),
             (f" {last.decode_rows:>3}", ""))
        line("prefill", (spark([r.prefill_rows for r in recent], width, top=rows_top), "sched--prefill"),
             (f" {last.prefill_rows:>3}", ""))
        if self.spec != "off" or any(r.draft_rows for r in recent):
            drafted = sum(r.draft_rows for r in recent)
            accepted = sum(r.draft_accepted for r in recent)
            line("draft", (spark([r.draft_rows for r in recent], width, top=rows_top), "sched--kv"),
                 (f" {last.draft_rows:>3}", ""))
            line("", (f"spec {self.spec}", "sched--kv"),
                 (f" · {accepted}/{drafted} accepted" if drafted else " · no drafts lately", "sched--dim"))
        line("budget", (f"{last.budget} rows", ""), (f" · step #{last.step}", "sched--dim"))
        if last.threads is not None:
            # The CPU thread count the engine chose between steps, and why (engine/threads.py).
            line("threads", (last.threads.short(), ""))
            line("", (last.threads.why, "sched--dim"))
        rate = self.rate
        if rate is None:
            line("rate", ("— (engine stopped)" if self.stopped else "— (nothing generating)", "sched--dim"))
        else:
            line("rate", (f"{rate:.1f} tok/s", ""), (f" · sum of {len(self.rates)} generating", "sched--dim"))

        filled = round(last.kv_used / last.kv_total * width) if last.kv_total else 0
        line("KV", ("█" * filled, "sched--kv"), ("░" * (width - filled), "sched--dim"))
        line("", (f"{last.kv_used}/{last.kv_total} cells", ""),
             (f" · {last.kv_idle} idle" if last.kv_idle else "", "sched--dim"))
        if last.ram is not None:
            # Evicted idle conversations' KV in host memory: their next turn restores it.
            line("host", (last.ram.short(), "sched--dim"))
        if self.stopped:
            line("seqs", ("engine stopped · ctrl+r restarts it", "sched--over"))
        else:
            line("seqs", (f"{last.running} running · {last.waiting} waiting", ""))
        return text

    def _render_endpoints(self, line, report: EndpointsReport) -> None:
        """Per server, only what the client measures: no step, budget or KV figures exist here."""
        for e in report.endpoints:
            line("server", (e.url.removeprefix("http://").removeprefix("https://"),
                            "sched--ok" if e.healthy else "sched--over"))
            if not e.healthy:
                line("", (f"dead: {e.last_error or 'not answering'}", "sched--over"))
            line("", (f"{e.in_flight}/{e.limit} in flight · {e.queued} queued", ""))
            line("", (f"{fmt_rate(e.tok_s)} tok/s", "sched--decode"))
            line("", (f"TTFT p50 {fmt_ms(e.ttft_p50_ms)} · p95 {fmt_ms(e.ttft_p95_ms)}", ""))
            line("", (f"{e.errors} errors", "sched--over" if e.errors else "sched--dim"),
                 (f" · last: {e.last_error}" if e.errors and e.healthy and e.last_error else "", "sched--dim"))
