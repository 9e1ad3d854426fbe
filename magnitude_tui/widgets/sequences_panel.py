"""Provides the sequences panel: one row per live sequence with its latency figures and rate sparkline."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.widgets.format import fmt_count, fmt_ms, fmt_rate, spark
from magnitude_tui.widgets.tool_block import ToolActivity
from scheduler.types import Phase, Priority

REFRESH_S = 0.25
RATE_SAMPLE_S = 0.25  # engine-clock spacing of the rate sparkline's samples
KEEP_DONE_S = 4.0  # a finished sequence stays listed briefly so a burst can be read afterwards
SPARK_WIDTH = 12

# Every column has a fixed width (its widest value: "done·cancelled", "99.9k/99.9k (99.9k)",
# "123.4 s", 12 sparkline cells): a table that sized columns to what it had seen so far grew
# sideways as values changed, and how wide it got depended on when it happened to repaint.
COLUMNS = {"pane": 7, "seq": 3, "class": 5, "phase": 14, "prompt (cached)": 19, "gen": 5, "queue": 7, "TTFT": 7,
           "tok/s": 5, "ITL p50/p95/max": 20, "spec": 9, "rate": SPARK_WIDTH}
# A sequence's priority class: a person's turn, an agent (subagent, API call), background (burst).
CLASS_LABEL = {Priority.INTERACTIVE: "you", Priority.AGENT: "agent", Priority.BACKGROUND: "bg"}


@dataclass
class _Row:
    name: str
    update: SeqUpdate
    rates: deque = field(default_factory=lambda: deque(maxlen=SPARK_WIDTH))
    sampled_at: float | None = None  # engine clock of the last rate sample
    done_at: float | None = None


class SequencesPanel(Vertical):
    """Live per-sequence view; fed every step, repainted a few times a second."""

    COMPONENT_CLASSES = {"seq--queued", "seq--preparing", "seq--prefill", "seq--generating", "seq--done",
                         "seq--error", "seq--tool"}
    DEFAULT_CSS = """
    SequencesPanel { height: auto; max-height: 45%; border-top: solid $primary 40%; }
    SequencesPanel > DataTable { height: auto; max-height: 18; background: $surface; }
    SequencesPanel .seq--queued { color: $secondary; }
    SequencesPanel .seq--preparing { color: $accent; }
    SequencesPanel .seq--prefill { color: $warning; }
    SequencesPanel .seq--generating { color: $primary; text-style: bold; }
    SequencesPanel .seq--done { color: $success; }
    SequencesPanel .seq--tool { color: $accent; text-style: bold; }
    SequencesPanel .seq--error { color: $error; }
    """

    def __init__(self, *, clock=time.monotonic, **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock = clock  # wall clock for ageing finished rows; tests freeze it
        self._rows: dict[str, _Row] = {}
        self._dirty = True
        self._shown: dict[str, list[object]] = {}  # the cells on screen, by session, in table order
        self._tools: dict[str, ToolActivity] = {}  # agents' sessions in the `tool` phase

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(cursor_type="none", zebra_stripes=True, show_cursor=False)
        for name, width in COLUMNS.items():
            table.add_column(name, width=width, key=name)
        yield table

    def on_mount(self) -> None:
        self.border_title = "sequences"
        self.set_interval(REFRESH_S, self.refresh_rows)

    def apply(self, update: SeqUpdate, name: str, t: float | None = None) -> None:
        """Take one update; `t` is the engine clock of its step (spaces the rate samples)."""
        row = self._rows.get(update.session_id)
        if row is None or row.update.request_id != update.request_id:
            rates = row.rates if row is not None else deque(maxlen=SPARK_WIDTH)
            row = self._rows[update.session_id] = _Row(name, update, rates)
        row.update = update
        row.done_at = self.clock() if update.phase is Phase.DONE else None
        if t is not None and (row.sampled_at is None or t - row.sampled_at >= RATE_SAMPLE_S):
            generating = update.phase is Phase.GENERATING
            row.rates.append((update.tok_s_live or 0.0) if generating else 0.0)
            row.sampled_at = t
        self._dirty = True

    def set_activity(self, session_id: str, activity: ToolActivity | None) -> None:
        """An agent's session waits on a tool or on approval (None: not any more): its row
        shows `tool` with the tool's name and the time so far, and stays while it does."""
        if activity is None:
            self._tools.pop(session_id, None)
        else:
            self._tools[session_id] = activity
        row = self._rows.get(session_id)
        if row is not None and row.done_at is not None and activity is None:
            row.done_at = self.clock()  # ages from the tool's end, like a turn's
        self._dirty = True

    def forget(self, session_id: str) -> None:
        if self._rows.pop(session_id, None) is not None:
            self._dirty = True

    @property
    def live_sessions(self) -> list[str]:
        return [s for s, r in self._rows.items() if r.update.phase is not Phase.DONE]

    def refresh_rows(self) -> None:
        now = self.clock()
        for session_id, row in list(self._rows.items()):
            if row.done_at is not None and now - row.done_at > KEEP_DONE_S and session_id not in self._tools:
                del self._rows[session_id]
                self._dirty = True
        if self._tools:
            self._dirty = True  # the tool phase's clock runs
        if not self._dirty or not self.display:
            return
        self._dirty = False
        table = self.query_one(DataTable)
        cells = {sid: self._cells(row, self._tools.get(sid)) for sid, row in sorted(self._rows.items(), key=lambda kv: _order(kv[1]))}
        if list(cells) != list(self._shown):  # rows came, went or moved: build the table again
            table.clear()
            for session_id, row_cells in cells.items():
                table.add_row(*row_cells, key=session_id)
        else:  # the same rows: touch only the cells whose text or style changed
            for session_id, row_cells in cells.items():
                for column, new, old in zip(COLUMNS, row_cells, self._shown[session_id]):
                    if _cell_key(new) != _cell_key(old):
                        table.update_cell(session_id, column, new)
        self._shown = cells

    def _cells(self, row: _Row, activity: ToolActivity | None = None) -> list[object]:
        u = row.update
        phase = u.phase.value if u.phase is not Phase.DONE else f"done·{u.done_reason.value if u.done_reason else '?'}"
        if u.yielding:  # an agent holding back its decode row for a person's prompt
            phase += "·yields"
        style_name = "error" if u.error else u.phase.value
        if activity is not None:
            phase, style_name = activity.cell(), "tool"
        style_key = f"seq--{style_name}" if f"seq--{style_name}" in self.COMPONENT_CLASSES else "seq--queued"
        prompt = f"{fmt_count(u.prompt_done)}/{fmt_count(u.prompt_total)} ({fmt_count(u.cached_tokens)})" if u.prompt_total else "—"
        rate = u.tok_s_live if u.phase is not Phase.DONE else u.tok_s
        itl = f"{fmt_ms(u.itl_p50_ms)}/{fmt_ms(u.itl_p95_ms)}/{fmt_ms(u.itl_max_ms)}"
        return [
            Text(row.name),  # a str cell is read as markup, and the name is what the user typed
            "—" if u.seq_id is None else str(u.seq_id),
            CLASS_LABEL[u.priority],
            Text(phase, style=self.get_component_rich_style(style_key)),
            prompt,
            f"~{u.generated}" if u.remote.tokens_estimated else str(u.generated),
            fmt_ms(u.queue_ms),
            fmt_ms(u.ttft_ms),
            fmt_rate(rate),
            itl,
            spec_text(u),
            Text(spark(row.rates, SPARK_WIDTH), style=self.get_component_rich_style("seq--generating")),
        ]


def spec_text(u: SeqUpdate) -> str:
    """Tokens gained per generating step and the share of draft tokens accepted ("2.3 78%"); for a
    reply sampled under a grammar (it never drafts), the mask's time per token ("mask 1.4", ms);
    "—" for a sequence that did neither."""
    if u.grammar_ms > 0 and u.generated:
        return f"mask {u.grammar_ms / u.generated:.1f}"
    acceptance = u.spec.acceptance  # None until a draft token was verified
    if acceptance is None or u.spec.tokens_per_step is None:
        return "—"
    return f"{u.spec.tokens_per_step:.1f} {round(100 * acceptance)}%"


def _cell_key(cell: object) -> object:
    return (cell.plain, str(cell.style)) if isinstance(cell, Text) else cell


def _order(row: _Row) -> tuple[int, str]:
    return (row.update.seq_id if row.update.seq_id is not None else 1 << 20, row.name)
