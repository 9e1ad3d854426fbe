"""A byte that is not UTF-8 from the terminal (an 8-bit Alt key, a Latin-1 paste) is read as
U+FFFD by Textual's real input thread, instead of ending it (and the app) with UnicodeDecodeError."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from textual.app import App
from textual.drivers import linux_driver

from magnitude_tui.terminal_input import lenient_terminal_input


def keys_read(data: bytes) -> tuple[list[str], list[BaseException]]:
    """The keys Textual's Linux driver's input thread reads from `data` (through a pipe), and what it raised."""
    async def make():
        return linux_driver.LinuxDriver(App())

    driver = asyncio.run(make())
    read_end, write_end = os.pipe()
    driver.fileno = read_end
    got: list = []
    errors: list[BaseException] = []
    driver.process_message = got.append  # type: ignore[method-assign]

    def run() -> None:
        try:
            driver.run_input_thread()
        except BaseException as e:  # noqa: BLE001 (what the thread died of is the result)
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        os.write(write_end, data)
        deadline = time.monotonic() + 5
        while len(got) < 3 and not errors and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        driver.exit_event.set()
        thread.join(5)
        os.close(write_end)
        os.close(read_end)
    return [getattr(e, "character", None) or getattr(e, "key", "") for e in got], errors


def test_a_byte_that_is_not_utf8_is_read_as_a_replacement_character(monkeypatch):
    monkeypatch.setattr(linux_driver, "getincrementaldecoder", linux_driver.getincrementaldecoder)
    assert lenient_terminal_input()
    keys, errors = keys_read(b"a\xffb")
    assert errors == [] and keys == ["a", "\ufffd", "b"]


def test_without_it_textual_s_input_thread_dies_on_such_a_byte(monkeypatch):
    # What the app is protected from; if Textual reads its input leniently itself one day, this
    # fails and the patch can go.
    import codecs

    monkeypatch.setattr(linux_driver, "getincrementaldecoder", codecs.getincrementaldecoder)
    _, errors = keys_read(b"a\xffb")
    assert len(errors) == 1 and isinstance(errors[0], UnicodeDecodeError)
