"""A paste longer than the whole context (9,687 tokens in an 8K context) fails, as it must; but the
pane also said "context full: the oldest 2 turns ... no longer fit" and greyed them, which was
false: nothing older was dropped, the new message cannot fit even alone. The pane now says only
that, with its size and the context's, and every earlier turn is still sent."""

from __future__ import annotations

from textual import events

from magnitude_tui.engine.context import fit_conversation
from magnitude_tui.engine.events import SeqUpdate, StepReport
from scheduler.types import DoneReason, ErrorKind, Phase
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, settle, wait_for

N_CTX = 8192


def _tokens(messages) -> list[int]:
    """A word a token, four for each message's template (what the scripted engine counts)."""
    return [0] * sum(len(m.content.split()) + 4 for m in messages)


class _FittingClient(ScriptedClient):
    """Fits each conversation as the engine does (engine/context.py); a prompt that does not fit
    even trimmed is refused as the engine refuses it: CONTEXT_LENGTH, with the drop it tried."""

    def submit(self, request):
        fitted = fit_conversation(request.messages, _tokens, N_CTX, request.sampling.max_tokens)
        if len(fitted.prompt) + 1 <= N_CTX:
            self.drop_next = fitted.dropped
            return super().submit(request)
        self.submitted.append(request)
        refusal = SeqUpdate(request.request_id, request.session_id, None, Phase.DONE,
                            prompt_total=len(fitted.prompt), dropped_messages=fitted.dropped,
                            done_reason=DoneReason.ERROR, error_kind=ErrorKind.CONTEXT_LENGTH,
                            error=f"the prompt is {len(fitted.prompt):,} tokens but a sequence can hold only "
                                  f"{N_CTX:,} (prompt plus reply); shorten the conversation or start the "
                                  "engine with a larger context (--n-ctx)")
        self._emit([StepReport(999, 1.0, 30.0, 0, 0, 40, 300, N_CTX, 0, 0, self.policy, [refusal])])


def _notes(pane) -> list[str]:
    return [str(note.render()) for note in pane.query(".context-note")]


async def test_a_message_longer_than_the_context_says_so_and_drops_no_turn(tmp_path):
    client = _FittingClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        for text in ("one", "two"):
            await one_turn(pilot, client, text)
        pane.composer.post_message(events.Paste("word " * 9_683))
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(client.submitted) == 3 and not pane.busy, what="the refusal")
        await settle(pilot)
        assert client.submitted[-1].messages[-1].content.startswith("word word")
        [note] = _notes(pane)
        assert "this message does not fit the context" in note and "9,687 tokens" in note and "8,192" in note
        assert "oldest" not in note
        assert not [n for n in app._notifications if "sequence can hold" in n.message]  # said once, above
        assert not pane.query("MessageView.-dropped")
        assert not any(pane.is_dropped(m) for m in pane.record.messages)
        # The next turn sends every earlier turn (the engine fits them to the context itself).
        await one_turn(pilot, client, "three")
        sent = [m.content for m in client.submitted[-1].messages]
        assert sent[:4] == ["one", sent[1], "two", sent[3]] and sent[-1] == "three"
