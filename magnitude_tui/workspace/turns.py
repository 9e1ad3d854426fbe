"""Provides the turns of a conversation: what Enter does (send, queue, slash command, resend an
edited message), retrying a reply, and what happens when a reply ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnitude_tui.commands import SLASH_HELP, UnknownRole, parse_slash
from magnitude_tui.records import MessageRecord
from magnitude_tui.subagents import SpawnSpec
from scheduler.types import DoneReason

if TYPE_CHECKING:
    from magnitude_tui.widgets.chat_pane import ChatPane
    from magnitude_tui.workspace.model import WorkspaceModel

# Slash commands that are the screen's own actions (the same as their keys).
SCREEN_ACTIONS = {"export": "export", "copy": "copy_answer"}


def wants_agent(pane: ChatPane) -> bool:
    """A pane whose role names tools runs every message as an agent task."""
    return pane.record.settings.tools is not None and not pane.raw


class Turns:
    """The workspace model owns one; it decides what each message typed into a pane becomes."""

    def __init__(self, model: WorkspaceModel) -> None:
        self.model = model
        self.host = model.host

    def _occupied(self, pane: ChatPane, doing: str) -> bool:
        """The pane replies, or an agent runs in it (between its turns too, while a tool runs or
        waits for approval): the conversation is the agent's until it ends. Says so when it is."""
        if pane.busy:
            self.host.notify(f"{pane.record.name} is replying; esc stops it {doing}", severity="warning")
            return True
        if self.host.agent_running(pane):
            self.host.notify(f"{pane.record.name} is running an agent; esc stops it {doing}", severity="warning")
            return True
        return False

    async def submitted(self, pane: ChatPane, text: str, editing: MessageRecord | None = None) -> None:
        if text.startswith("/"):
            await self.slash(pane, text)
        elif (editing is not None and not pane.busy and not self.host.agent_running(pane)
              and any(m is editing for m in pane.record.messages)):
            await self._forget(pane, await pane.truncate(editing, keep=False))
            await self.send(pane, text)
        elif pane.busy or pane.queued or self.host.agent_running(pane):
            pane.queue(text)  # the next turn, once the reply (and anything queued before) is done
            self.model.keep_queue(pane)
        elif wants_agent(pane):  # its role names tools: the message is a task
            await self.host.start_agent(pane, text)
        else:
            await self.send(pane, text)

    async def send(self, pane: ChatPane, text: str) -> None:
        await pane.add_message(MessageRecord("user", text))
        self.model.submit_turn(pane)

    def edit_last(self, pane: ChatPane) -> None:
        """Up in an empty composer: the last message comes back to be edited and sent again."""
        if self._occupied(pane, "before an edit"):
            return
        message = pane.last_prompt()
        if message is not None:
            pane.start_editing(message)

    async def retry(self, pane: ChatPane) -> None:
        """ctrl+g: ask again with the same conversation; the latest reply's answers are kept, and
        the new one joins them (alt+left/right page between them)."""
        if self._occupied(pane, "first"):
            return
        last = next((m for m in reversed(pane.record.messages) if m.role != "assistant"), None)
        if last is None:
            self.host.notify("Nothing to retry yet", severity="warning")
            return
        removed = await pane.truncate(last, keep=True)
        removed_replies = [m for m in removed if m.role == "assistant" and m.content]
        pane.replies.carried = removed_replies[-1].answers if removed_replies else []
        await self._forget(pane, removed)
        self.model.submit_turn(pane)

    async def page_answer(self, pane: ChatPane, step: int) -> None:
        """alt+left / alt+right: show the reply's earlier or later answer (kept by retry); the
        shown one is what the next turn sends."""
        reply = pane.last_reply()
        if reply is None or not reply.others:
            self.host.notify("One answer only: ctrl+g asks again and keeps this one", severity="warning")
            return
        if self._occupied(pane, "first"):
            return
        index = reply.shown + step
        if 0 <= index <= len(reply.others):
            await pane.show_answer(reply, index)

    async def _forget(self, pane: ChatPane, removed: list[MessageRecord]) -> None:
        for message in removed:
            if message.id is not None:
                self.model.store.delete_message(message.id)

    async def slash(self, pane: ChatPane, text: str) -> None:
        model, host = self.model, self.host
        try:
            command = parse_slash(text, model.roles)
        except UnknownRole as exc:
            host.notify(f"{model.role_book.unknown(exc.name)} · usage: /spawn [ROLE] N task", severity="warning",
                      timeout=10, markup=False)
            pane.return_to_composer([text])  # fix the name and send again
            return
        except ValueError as exc:
            # The text goes back to the composer to be fixed: a typo in a long /spawn task, or a
            # message that only begins with a slash ("/usr/bin/python crashes"), was lost.
            host.notify(f"{exc} · the text is back in the composer; a leading space sends it as a message",
                        severity="warning", markup=False, timeout=10)
            pane.return_to_composer([text])
            return
        if command.name == "agent":
            await host.start_agent(pane, command.arg, command.role)
        elif command.name == "spawn":
            await model.subagents.spawn(pane, SpawnSpec(command.count, command.arg, command.role))
        elif command.name == "burst":
            await model.subagents.burst(pane, command.count)
        elif command.name == "policy":
            model.client.set_policy(command.arg)  # the panel changes when PolicyChanged comes back
        elif command.name in SCREEN_ACTIONS:
            host.perform(SCREEN_ACTIONS[command.name])
        elif command.name == "retry":
            await self.retry(pane)
        elif command.name == "raw":
            pane.set_raw(not pane.raw)
            host.notify(f"{pane.record.name}: " + ("raw completion: the transcript is continued as text, "
                      "without the chat template (/raw again to chat)" if pane.raw else "chat mode"))
        else:
            host.notify(SLASH_HELP, timeout=10, markup=False)

    async def reply_finished(self, event: ChatPane.ReplyFinished) -> None:
        model, pane = self.model, event.pane
        reported = await model.subagents.reply_finished(event)
        if reported and not pane.busy:
            model.release_session(pane)  # its answer is in the parent now: the KV goes back to the pool
        reason = event.update.done_reason
        if pane.replies.carried and event.message is None:
            await self._restore_answers(pane)  # a retry that gave no text: the answers come back
        elif reason is DoneReason.CANCELLED and event.message is None:
            await self._withdraw_prompt(pane)
        if pane.busy or not pane.queued or self.host.agent_running(pane):
            return  # (a running agent sends what was queued when it ends)
        if reason in (DoneReason.STOP, DoneReason.LENGTH):
            await self.send(pane, pane.next_queued() or "")
        else:  # stopped (esc) or failed: what was queued goes back to the composer, unsent
            pane.return_to_composer([t for t in iter(pane.next_queued, None)])
        self.model.keep_queue(pane)

    async def send_restored_queue(self, panes: list[ChatPane]) -> None:
        """On resume: a pane whose reply the quit (or a crash) cut off sends what was queued behind
        it, as that reply's end would have; the rest stays queued behind this turn. A message the
        quit cut off before its reply began is not sent again unasked: the pane says so."""
        for pane in panes:
            if pane.queued and not pane.busy:
                await self.send(pane, pane.next_queued() or "")
                self.model.keep_queue(pane)
            elif pane.replies.unanswered_prompt() is not None:  # the quit came before its reply began
                pane.replies.note("not answered: the app ended before this message's reply began; "
                                  "↑ in the empty composer brings it back to send again")

    async def _restore_answers(self, pane: ChatPane) -> None:
        carried, pane.replies.carried = pane.replies.carried, []
        await pane.add_message(MessageRecord("assistant", carried[-1], others=carried[:-1],
                                             shown=len(carried) - 1))

    async def _withdraw_prompt(self, pane: ChatPane) -> None:
        """A reply cancelled before its first token: its prompt leaves the context and returns to
        the composer, so the conversation does not silently keep a question nobody answered."""
        message = await pane.withdraw_last_prompt()
        if message is None:
            return
        await self._forget(pane, [message])
        pane.return_to_composer([message.content])
        self.host.notify(f"{pane.record.name}: stopped before the reply began; your message is "
                              "back in the composer and out of the context", timeout=6)
