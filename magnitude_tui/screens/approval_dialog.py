"""Provides the approval dialog (one agent's tool call: allow once, allow for the pane, deny with a reason) and DialogApproval, the core's Approval protocol on it."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from magnitude_tui.agent.policy import ALLOW_ONCE, ALLOW_PANE, ApprovalRequest, Decision, deny
from magnitude_tui.agent.transcript import visible

DEFAULT_DENY = "the user said no"
# A question that appears while someone is typing (a message half-written in a pane's input)
# takes no allowing key (y, a, Enter on Allow) for this long: the next letters of that message
# would otherwise answer it unseen, "a" allowing the tool for the whole pane. Denying is not held.
ARM_S = 1.0
# s in the dialog: this call is denied and the agent stops (its pane's agent, with its subagents).
STOP = deny("the user stopped the agent")
NARROW_COLUMNS = 88  # a narrower screen gets the buttons in two rows (the row takes 71 columns)
SHORT_ROWS = 30  # a shorter one, one-row buttons and no key hints


def who(request: ApprovalRequest) -> str:
    """The requesting agent, and its parent for a subagent."""
    return request.agent if request.parent is None else f"{request.agent} (subagent of {request.parent})"


def pretty_arguments(arguments: str) -> str:
    """The whole JSON arguments, indented (as written when they are not JSON), with what a
    terminal would act on written out as escapes (`visible`)."""
    try:
        text = json.dumps(json.loads(arguments or "{}"), indent=2, ensure_ascii=False)
    except ValueError:
        text = arguments
    return visible(text)


class ApprovalDialog(ModalScreen[Decision]):
    """y: allow once · a: allow this tool for the pane · n: deny (then a reason, Enter sends it);
    esc denies without a reason; s denies and stops the agent (a model that asks again and again
    would otherwise take a denial per turn). Nothing runs until one is chosen."""

    BINDINGS = [
        Binding("y", "allow_once", "Allow once"),
        Binding("a", "allow_pane", "Allow for this pane"),
        Binding("n", "deny", "Deny"),
        Binding("escape", "deny_now", "Deny"),
        Binding("s", "stop", "Stop the agent"),
    ]
    # The arguments and the diff scroll in one body that takes what the screen leaves (`max-height:
    # 1fr`); the reason field, the key hints and the buttons are docked at the foot. Two boxes of
    # up to 20 rows each pushed the diff and the buttons off an 80x24 terminal.
    DEFAULT_CSS = """
    ApprovalDialog { align: center middle; }
    ApprovalDialog > Vertical { width: 90%; max-width: 110; height: auto; max-height: 90%; padding: 1 2;
                                border: thick $warning; background: $surface; }
    ApprovalDialog #approval-title { text-style: bold; }
    ApprovalDialog .approval-label { margin: 1 0 0 0; color: $text-muted; }
    ApprovalDialog #approval-body { height: auto; max-height: 1fr; }
    ApprovalDialog #approval-args, ApprovalDialog #approval-diff { background: $panel; }
    ApprovalDialog #approval-diff { color: $text; }
    ApprovalDialog #approval-caution { color: $warning; text-style: bold; margin: 1 0 0 0; }
    ApprovalDialog #approval-foot { dock: bottom; height: auto; }
    ApprovalDialog #approval-reason { display: none; }
    ApprovalDialog #approval-reason.-shown { display: block; }
    ApprovalDialog Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    ApprovalDialog Button { margin-left: 1; }
    ApprovalDialog.-narrow Horizontal { layout: grid; grid-size: 2; grid-gutter: 0 1; }
    ApprovalDialog.-narrow Button { width: 1fr; margin-left: 0; }
    ApprovalDialog.-short #approval-hint { display: none; }
    ApprovalDialog.-short > Vertical { padding: 0 1; }
    """

    def __init__(self, request: ApprovalRequest, arm_s: float = 0.0) -> None:
        """`arm_s`: how long after it is shown allowing keys are ignored (someone was typing)."""
        super().__init__()
        self.request = request
        self.withdrawn = False  # its agent stopped while another screen lay over it
        self.arm_s = arm_s
        self._armed_at = float("inf")  # set when shown

    def armed(self) -> bool:
        """Whether allowing is taken now (not within arm_s of the question being shown)."""
        return time.monotonic() >= self._armed_at

    def on_screen_resume(self) -> None:
        # Uncovered after its question went away: nothing left to answer. The event comes late
        # (its own push's, under load, can arrive after another screen was pushed over it), and
        # dismiss pops whatever screen is on top: only the top one may go.
        if self.withdrawn and self.is_attached and self is self.app.screen:
            self.withdrawn = False
            self.dismiss(None)

    def compose(self) -> ComposeResult:
        r = self.request
        with Vertical():
            yield Label(f"{who(r)} wants to call {r.tool} ({r.kind.value})", id="approval-title", markup=False)
            with VerticalScroll(id="approval-body"):
                if r.caution:  # asked each time, even with the tool allowed for the pane
                    yield Static(visible(f"caution: {r.caution} (asked each time, even with {r.tool} allowed for "
                                         "this pane)"), id="approval-caution", markup=False)
                yield Label("Arguments", classes="approval-label")
                yield Static(pretty_arguments(r.arguments), id="approval-args", markup=False)
                if r.preview:
                    yield Label("What it changes", classes="approval-label")
                    # A file's escape sequences or bidirectional overrides could hide lines of the
                    # diff on the terminal: they are shown as escapes (as `run` prints them).
                    yield Static(visible(r.preview), id="approval-diff", markup=False)
            with Vertical(id="approval-foot"):
                yield Input(placeholder="why not? (sent to the model; Enter denies)", id="approval-reason")
                yield Label("y allow once · a allow this tool for the pane · n deny with a reason · esc deny · "
                            "s stop the agent", classes="approval-label", id="approval-hint")
                if self.arm_s > 0:
                    yield Label(f"you were typing: y, a and Allow take effect after {self.arm_s:g} s",
                                classes="approval-label", id="approval-armed")
                with Horizontal():
                    yield Button("Stop agent (s)", id="approval-stop")
                    yield Button("Deny (n)", variant="error", id="approval-deny")
                    yield Button("For this pane (a)", id="approval-pane")
                    yield Button("Allow once (y)", variant="primary", id="approval-once")

    def on_resize(self, event: events.Resize) -> None:
        # Below 88 columns the four buttons do not fit in a row: two rows of two. Below 30 rows
        # the buttons take one row each and the key hints go (the buttons name the keys), so
        # the arguments and the diff keep some rows.
        self.set_class(event.size.width < NARROW_COLUMNS, "-narrow")
        self.set_class(event.size.height < SHORT_ROWS, "-short")
        for button in self.query(Button):
            button.compact = event.size.height < SHORT_ROWS

    def on_mount(self) -> None:
        self._armed_at = time.monotonic() + self.arm_s
        self.query_one("#approval-once", Button).focus()

    def _reason_open(self) -> bool:
        return self.query_one("#approval-reason", Input).has_class("-shown")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # While the reason is typed, its letters are text, not choices.
        if action in ("allow_once", "allow_pane", "deny", "stop") and self._reason_open():
            return False
        return True

    @on(Button.Pressed, "#approval-once")
    def action_allow_once(self) -> None:
        if self.armed():
            self.dismiss(ALLOW_ONCE)

    @on(Button.Pressed, "#approval-pane")
    def action_allow_pane(self) -> None:
        if self.armed():
            self.dismiss(ALLOW_PANE)

    @on(Button.Pressed, "#approval-deny")
    def action_deny(self) -> None:
        reason = self.query_one("#approval-reason", Input)
        if self._reason_open():
            self._deny_with(reason.value)
            return
        reason.add_class("-shown")
        reason.focus()

    @on(Button.Pressed, "#approval-stop")
    def action_stop(self) -> None:
        self.dismiss(STOP)

    def action_deny_now(self) -> None:
        self._deny_with(self.query_one("#approval-reason", Input).value)

    @on(Input.Submitted, "#approval-reason")
    def _reason_given(self, event: Input.Submitted) -> None:
        self._deny_with(event.value)

    def _deny_with(self, reason: str) -> None:
        self.dismiss(deny(reason.strip() or DEFAULT_DENY))


class DialogApproval:
    """The Approval protocol on the dialog: one request on screen at a time (subagents of one
    spawn may ask together; they wait their turn)."""

    def __init__(self, app: App, on_stop: Callable[[ApprovalRequest], None] | None = None) -> None:
        """`on_stop`: called with the request when the user chose to stop its agent."""
        self.app = app
        self.on_stop = on_stop
        self._lock = asyncio.Lock()

    async def ask(self, request: ApprovalRequest) -> Decision:
        async with self._lock:
            answer: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()

            def done(decision: Decision | None) -> None:
                if not answer.done():
                    answer.set_result(decision if decision is not None else deny(DEFAULT_DENY))
                if decision is STOP and self.on_stop is not None:
                    self.on_stop(request)

            # Someone with a message half-typed may be typing on: the question holds its allowing keys.
            focused = self.app.focused
            typing = (isinstance(focused, Input) and bool(focused.value)) or \
                (isinstance(focused, TextArea) and bool(focused.text))
            screen = ApprovalDialog(request, ARM_S if typing else 0.0)
            self.app.push_screen(screen, done)
            try:
                return await answer
            except asyncio.CancelledError:  # the agent was stopped: its question goes away
                if screen.is_attached and screen is self.app.screen:  # not already dismissed
                    screen.dismiss(None)
                else:  # under another screen (a dialog, the palette): it goes when uncovered
                    screen.withdrawn = True
                raise
