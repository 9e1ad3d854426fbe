"""Provides `magnitude-tui run`: one agent loop to its end without the TUI, its transcript printed (or JSON), approval asked on the terminal."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import termios
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TextIO

from magnitude_tui.agent.config import AgentFileConfig
from magnitude_tui.agent.engine_link import HubRunner, TurnRunner
from magnitude_tui.agent.events import EndReason
from magnitude_tui.agent.loop import AgentOutcome
from magnitude_tui.agent.mcp_tools import McpServers
from magnitude_tui.agent.policy import Approval, ApprovalRequest, ApprovePolicy, Decision, FixedApproval, Verdict, deny
from magnitude_tui.agent.team import AgentTeam, RoleToolsError
from magnitude_tui.agent.transcript import RunRecorder, dump, visible
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings, unknown_role
from scheduler.types import SamplingParams

# How long the engine may take to load before the run gives up.
LOAD_WAIT_S = 600.0
NO_TERMINAL = ("no terminal to ask on (stdin is not a TTY); run with --approve auto, or give the role "
               "approve = \"auto\", to let it write and run commands")


@dataclass(frozen=True)
class RunOptions:
    task: str
    workdir: Path
    role: str | None = None
    approve: ApprovePolicy | None = None  # None: the role's own policy (ask when it names none)
    json_out: bool = False
    max_turns: int = 20
    sampling: SamplingParams = SamplingParams(max_tokens=1024)


class TerminalApproval:
    """Asks on the terminal, one request at a time (subagents may ask together)."""

    def __init__(self, prompt_out: TextIO | None = None, stdin: TextIO | None = None) -> None:
        self.out = prompt_out or sys.stderr
        self.stdin = stdin or sys.stdin
        self._lock = asyncio.Lock()
        self._pending = b""  # read past the line asked for (typed ahead)

    async def ask(self, request: ApprovalRequest) -> Decision:
        async with self._lock:
            self._drop_typed_ahead()
            self.out.write("\n" + visible(request.describe()) + "\n")
            while True:
                self.out.write("allow? [y] once, [a] always for this agent, [n] no: ")
                self.out.flush()
                answer = (await self._readline()).strip().lower()
                if answer in ("y", "yes"):
                    return Decision(Verdict.ALLOW_ONCE)
                if answer in ("a", "always"):
                    return Decision(Verdict.ALLOW_PANE)
                if answer in ("n", "no", ""):
                    self.out.write("reason for the model (optional): ")
                    self.out.flush()
                    reason = (await self._readline()).strip()
                    return deny(reason or "the user said no")

    def _drop_typed_ahead(self) -> None:
        """Forget what was typed before this question was shown (a `y` meant for the last one, keys
        pressed while the model wrote): only an answer typed after it is asked may allow a call."""
        self._pending = b""
        try:
            fd = self.stdin.fileno()
            if os.isatty(fd):
                termios.tcflush(fd, termios.TCIFLUSH)
        except (AttributeError, OSError, ValueError, termios.error):
            pass

    async def _readline(self) -> str:
        """A line of the answer ("" at end of input). A terminal is read when the event loop sees it
        readable, not by a readline in a thread: Ctrl-C then ends the run at once, where asyncio.run
        would wait for that thread's readline until someone pressed enter."""
        try:
            fd = self.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # a StringIO (tests): no descriptor
            return await asyncio.to_thread(self.stdin.readline)
        loop = asyncio.get_running_loop()
        while b"\n" not in self._pending:
            readable: asyncio.Future[None] = loop.create_future()

            def woke(f: asyncio.Future[None] = readable) -> None:
                if not f.done():
                    f.set_result(None)

            loop.add_reader(fd, woke)
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            chunk = os.read(fd, 4096)
            if not chunk:  # end of input: what is left, then "" (no)
                break
            self._pending += chunk
        line, sep, self._pending = self._pending.partition(b"\n")
        return (line + sep).decode("utf-8", errors="replace")


def terminal_approval(stdin: TextIO | None = None) -> Approval:
    """Ask on the terminal when there is one; otherwise deny, saying how to allow."""
    stdin = stdin or sys.stdin
    try:
        tty = stdin.isatty()
    except (AttributeError, ValueError):
        tty = False
    return TerminalApproval(sys.stderr, stdin) if tty else FixedApproval(deny(NO_TERMINAL))


async def run_task(opts: RunOptions, runner: TurnRunner, *, roles: Mapping[str, AgentSettings],
                   file_config: AgentFileConfig = AgentFileConfig(), approval: Approval | None = None,
                   out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the task's agent loop on `runner` to its end; 0 when it answered. `out` and `err`
    default to the streams in place when it is called (not when this module was imported)."""
    out, err = out or sys.stdout, err or sys.stderr
    if opts.role is not None and opts.role not in roles:
        err.write(unknown_role(opts.role, list(roles)) + "\n")
        return 2
    settings = roles[opts.role] if opts.role is not None else AgentSettings()
    try:
        workspace = Workspace(opts.workdir, pass_env=file_config.pass_env)
    except OSError as e:
        err.write(f"--workdir {opts.workdir}: {e}\n")
        return 2
    servers = McpServers(file_config.mcp)
    await servers.start()
    try:
        for name, why in servers.problems.items():
            err.write(f"warning: MCP server {name}'s tools are unavailable: {why}\n")
        recorder = RunRecorder(None if opts.json_out else out)
        team = AgentTeam(runner, workspace, roles=roles, approval=approval, observer=recorder,
                         mcp_tools=servers.tools(), limits=file_config.spawn, sampling=opts.sampling,
                         max_turns=opts.max_turns)
        try:
            loop = team.agent(settings, name=opts.role or "main", session_id=f"run-{uuid.uuid4().hex[:8]}",
                              policy=opts.approve)
        except RoleToolsError as e:
            err.write(f"{e}\n")
            return 2
        try:
            outcome = await loop.run(opts.task, team.history(settings))
        except asyncio.CancelledError:
            # Ctrl-C or SIGTERM: the tool running was stopped (a command's whole process group);
            # what the run did so far is still said, and with --json still printed as a document.
            err.write("the run was interrupted before the agent answered\n")
            if opts.json_out:
                stopped = AgentOutcome(EndReason.CANCELLED, "", loop.messages, error="interrupted")
                dump(recorder.document(opts.task, opts.role, stopped, servers.problems), out)
            raise
        if opts.json_out:
            dump(recorder.document(opts.task, opts.role, outcome, servers.problems), out)
        elif outcome.ok:
            out.write("\n" + outcome.answer.strip() + "\n")
        else:
            err.write(f"the agent did not finish: {outcome.error or outcome.reason.value}\n")
        if outcome.ok and outcome.truncated:
            err.write(f"warning: the answer was cut at {loop.config.sampling.max_tokens} tokens (--max-tokens, "
                      "or the role's max_tokens); it may be incomplete\n")
        return 0 if outcome.ok else 1
    finally:
        await servers.close()


# Signals that end a run the way Ctrl-C does (asyncio.run already turns SIGINT into cancelling it).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


async def until_stopped(work) -> int:
    """Await `work` (an exit status); SIGTERM or SIGHUP cancel it, as Ctrl-C does, so what it
    started is stopped (a command's process group, MCP servers, the engine) instead of the process
    dying with them left running; the status is then 128 + the signal. A second signal kills at once."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def stop(sig: int) -> None:
        if received:  # already stopping: the user insists
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        received.append(sig)
        task.cancel()

    installed = []
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored on purpose (`nohup` ignores SIGHUP): it stays ignored
        try:
            loop.add_signal_handler(sig, stop, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
            pass
    try:
        return await work
    except asyncio.CancelledError:
        if not received:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        return 128 + received[0]
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def run_on_client(opts: RunOptions, client, **kw) -> int:
    """Start `client`, wait for its engine, run the task, stop it (also on SIGTERM and SIGHUP)."""
    return await until_stopped(_run_on_client(opts, client, **kw))


async def _run_on_client(opts: RunOptions, client, **kw) -> int:
    from magnitude_tui.serve.hub import EngineHub, EngineState

    err: TextIO = kw.get("err") or sys.stderr
    hub = EngineHub(client, callers_see_errors=True)  # whoever runs `run` runs the engine too

    def warn(message: str) -> None:
        err.write(f"warning: {message}\n")

    hub.on_notice = warn
    client.start()
    pump = asyncio.create_task(hub.run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOAD_WAIT_S
        while hub.state is EngineState.LOADING:
            hub.state_changed.clear()
            try:
                await asyncio.wait_for(hub.state_changed.wait(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                err.write(f"the engine did not load within {LOAD_WAIT_S:.0f} s\n")
                return 1
        if hub.state is EngineState.FAILED:
            err.write(f"the engine failed: {hub.failure}\n")
            return 1
        return await run_task(opts, HubRunner(hub), **kw)
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        await asyncio.to_thread(client.stop)
