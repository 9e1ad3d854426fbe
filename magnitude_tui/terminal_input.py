"""Provides lenient_terminal_input: the terminal's input read with bytes that are not UTF-8 as U+FFFD.

Textual's Linux driver decodes what the terminal sends as strict UTF-8, in its input thread. One
byte that is not UTF-8 (an 8-bit Alt key, a paste from a Latin-1 terminal, `tmux send-keys -H ff`)
raised UnicodeDecodeError there: the app ended with a traceback and the composer's unsent text was
lost. The driver looks the decoder up through its module's `getincrementaldecoder` each time its
input thread starts, so handing it one that replaces such bytes is enough; nothing else changes.
"""

from __future__ import annotations

import codecs
import functools


def _replacing(encoding: str):
    """The incremental decoder class for `encoding`, made with errors="replace"."""
    return functools.partial(codecs.getincrementaldecoder(encoding), errors="replace")


def lenient_terminal_input() -> bool:
    """Make Textual's Linux driver read undecodable input bytes as U+FFFD. False where that driver
    is not there (another platform) or no longer looks its decoder up this way (say so in a test)."""
    try:
        from textual.drivers import linux_driver
    except ImportError:  # not a POSIX terminal: Textual's Windows driver reads keys as text
        return False
    if not hasattr(linux_driver, "getincrementaldecoder"):
        return False
    linux_driver.getincrementaldecoder = _replacing
    return True
