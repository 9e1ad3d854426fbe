"""Provides run_command: a shell command in the workspace root, in its own process group, with a timeout, an output cap and the app's environment less its secrets."""

from __future__ import annotations

import asyncio
import os
import signal
from fnmatch import fnmatchcase
from typing import Mapping, Sequence

from magnitude_tui.agent.policy import ToolKind
from magnitude_tui.agent.process_group import wait_gone
from magnitude_tui.agent.toolbox import AgentTool, ToolResult, function_tool
from magnitude_tui.agent.workspace import Workspace

# After SIGTERM to the group, how long its processes get before SIGKILL.
TERM_GRACE_S = 1.0
# After SIGKILL, how long a stop waits for the group's processes to be gone: a signalled process
# ends only once the kernel schedules it, which on a busy machine is after the shell's end is seen.
KILL_WAIT_S = 2.0
# How often the shell's end is looked for (Process.wait would also wait for the output pipe to close).
EXIT_POLL_S = 0.02
# After the command's group is gone, how long its output may take to end: longer means a process
# that left the group (setsid, a daemon) holds the pipe, and reading stops.
DRAIN_S = 1.0
# A variable whose name holds one of these (in any letter case) is not passed to the model's
# commands (codex's default, and the usual spellings of passwords and credentials): API keys,
# AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN. The agents file's `[run_command] pass_env` passes named ones.
SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")
# Shorter spellings, taken only as a whole part of the name between underscores (DB_PASS,
# MYSQL_PWD, GH_PAT; not COMPASS_DIR, PATH, or PWD itself, the working directory).
SECRET_PARTS = ("PASS", "PWD", "PAT")
NOT_SECRET = ("PWD", "OLDPWD")
WITHHELD_WORDS = (", ".join(SECRET_WORDS[:-1]) + " or " + SECRET_WORDS[-1] + ", or have a part "
                  + ", ".join(SECRET_PARTS[:-1]) + " or " + SECRET_PARTS[-1] + " between underscores")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    if upper in NOT_SECRET:
        return False
    return any(word in upper for word in SECRET_WORDS) or any(part in SECRET_PARTS for part in upper.split("_"))


def command_env(environ: Mapping[str, str], pass_env: Sequence[str] = ()) -> tuple[dict[str, str], list[str]]:
    """(the environment a command gets, the names withheld from it): `environ` less the variables
    whose names look secret, except those `pass_env` names (a name, or a pattern such as AWS_*)."""
    env: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in environ.items():
        if looks_secret(name) and not any(fnmatchcase(name, pattern) for pattern in pass_env):
            withheld.append(name)
        else:
            env[name] = value
    return env, sorted(withheld)


def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the shell's pid
    except (ProcessLookupError, PermissionError):
        pass


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """The shell's exit status once it ends. Not Process.wait: that also waits until every copy of
    the output pipe is closed, which a background job (`server &`) holds open past the shell's end."""
    while proc.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)
    return proc.returncode


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End the command and everything it started (a cancelled pane, a timeout)."""
    _kill_group(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(_exited(proc), TERM_GRACE_S)
    except asyncio.TimeoutError:
        pass
    _kill_group(proc, signal.SIGKILL)  # also whatever the shell left behind in the group
    await _exited(proc)
    # A stop returns once the group is gone, not just signalled (a cancelled run reports it stopped).
    await wait_gone(proc.pid, KILL_WAIT_S, EXIT_POLL_S)


class _Output:
    """The first `cap` bytes of the output, and how many more came (read to the end so the command
    never blocks); what was read stays here if reading is stopped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.extra = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = max(self.cap - len(self.kept), 0)
            self.kept += chunk[:room]
            self.extra += max(len(chunk) - room, 0)


class CommandTool:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def tool(self) -> AgentTool:
        return AgentTool(function_tool(
            "run_command", "Run a shell command in the workspace root; returns its exit status and output. "
            f"Environment variables whose names contain {WITHHELD_WORDS}, are not set.",
            {"command": {"type": "string"},
             "timeout_s": {"type": "number", "exclusiveMinimum": 0}}, ["command"]),
            ToolKind.RUN, self.run, self.preview)

    def preview(self, args: dict) -> str | None:
        """What the approval shows besides the command: the variables it will not get (names only)."""
        _, withheld = command_env(os.environ, self.ws.pass_env)
        if not withheld:
            return None
        return (f"environment: {len(withheld)} variable{'' if len(withheld) == 1 else 's'} withheld from the "
                f"command (names that contain {WITHHELD_WORDS}; the agents file's [run_command] pass_env passes them): "
                + ", ".join(withheld))

    async def run(self, args: dict) -> ToolResult:
        limit = self.ws.limits.command_timeout_s
        timeout = min(float(args.get("timeout_s") or limit), limit)
        env, _ = command_env(os.environ, self.ws.pass_env)
        starting = asyncio.ensure_future(asyncio.create_subprocess_shell(
            args["command"], cwd=self.ws.root, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True))
        try:
            proc = await asyncio.shield(starting)
        except OSError as e:
            return ToolResult.failed(f"the command could not start: {e}")
        except asyncio.CancelledError:
            # Cancelled while the shell was being started: it may already run (the fork comes
            # before the pipes are set up), so it is stopped like a running one before going.
            try:
                started = await starting
            except OSError:
                raise asyncio.CancelledError from None
            await _stop(started)
            _close(started)
            raise
        output = _Output(self.ws.limits.output_chars)
        assert proc.stdout is not None  # stdout=PIPE
        reader = asyncio.ensure_future(output.read(proc.stdout))
        try:
            await asyncio.wait_for(_exited(proc), timeout)
        except asyncio.TimeoutError:
            await _stop(proc)
            status, ok = f"killed after {timeout:g} s (timeout)", False
        except BaseException:  # cancelled (esc, the pane closed): the whole group goes
            await asyncio.shield(_stop(proc))
            reader.cancel()
            _close(proc)
            raise
        else:
            # What the command left running in its group would hold the output pipe open forever.
            _kill_group(proc, signal.SIGKILL)
            status, ok = f"exit status {proc.returncode}", proc.returncode == 0
        held = ""
        try:
            await asyncio.wait_for(asyncio.shield(reader), DRAIN_S)
        except asyncio.TimeoutError:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            held = ("\n[output stopped: a process the command started outside its process group "
                    "(setsid, a daemon) still holds it open, and is still running]")
        _close(proc)
        return ToolResult(_render(bytes(output.kept), output.extra, status) + held, ok=ok)


def _close(proc: asyncio.subprocess.Process) -> None:
    """Let go of the output pipe (a process outside the group may still hold its other end)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _render(out: bytes, extra: int, status: str) -> str:
    text = out.decode("utf-8", errors="replace")
    more = f"\n[{extra} more bytes of output not shown]" if extra else ""
    return f"{status}\n{text}{more}"
