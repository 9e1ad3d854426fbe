"""Full garbage collections run between keys, not on their own in the middle of typing
(magnitude_tui/gc_pacing.py; docs/design/tui.md, "Garbage collection")."""

from __future__ import annotations

import gc

from magnitude_tui.gc_pacing import MIDDLE, NEVER, YOUNG, GcPacer
from tests.app_support import SIZE, ScriptedClient, make_app, wait_for


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_full_collection_waits_for_a_pause_in_typing_but_not_forever():
    clock = Clock()
    pacer = GcPacer(every_s=5, max_s=20, idle_s=0.3, clock=clock)
    saved = gc.get_threshold()
    pacer.start()
    try:
        assert gc.get_threshold()[2] == NEVER and gc.get_freeze_count() > 0
        clock.t += 1
        assert not pacer.tick(last_key_at=0.0)  # idle, but one ran less than every_s ago
        clock.t += 5
        assert not pacer.tick(last_key_at=clock.t - 0.1)  # due, but a key just came
        assert pacer.tick(last_key_at=clock.t - 0.5)  # due and no key for idle_s
        clock.t += 19
        assert not pacer.tick(last_key_at=clock.t)  # typing, not yet max_s
        clock.t += 2
        assert pacer.tick(last_key_at=clock.t)  # typing for max_s: it runs anyway
        assert pacer.full_collections == 2
    finally:
        pacer.stop()
    assert gc.get_threshold() == saved and gc.get_freeze_count() == 0


async def test_the_running_app_turns_off_automatic_full_collections_and_restores_them_at_exit(tmp_path):
    saved = gc.get_threshold()
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.gc_pacer.running, what="the pacer started after the first frame")
        # Before: CPython's own full collections ran every 0.6 s with eight panes streaming,
        # 130-360 ms each, and keys typed meanwhile waited for them.
        assert gc.get_threshold() == (YOUNG, MIDDLE, NEVER)  # young collections 14x less often too
        assert gc.get_freeze_count() > 0  # what existed at start is never walked again
        assert app.gc_pacer.running
    assert gc.get_threshold() == saved and gc.get_freeze_count() == 0


async def test_a_tick_during_exit_after_the_screens_are_gone_does_nothing(tmp_path):
    # At exit Textual clears the installed screens before it stops the app's timers; a pacer tick
    # in between once failed the exit with "No screen called 'workspace' installed".
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.gc_pacer.running, what="the pacer started after the first frame")
        collections = app.gc_pacer.full_collections
        screens = dict(app._installed_screens)
        app._installed_screens.clear()  # the state _close_all leaves before the timers stop
        try:
            app._collect_between_keys()
        finally:
            app._installed_screens.update(screens)
        assert app.gc_pacer.full_collections == collections
