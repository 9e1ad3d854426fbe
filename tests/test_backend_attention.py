"""The attention path: chosen by measurement (cached), forced when asked or by a quantized V cache,
and reported; on the real model, the cost model then predicts steps deep in a context."""

from __future__ import annotations

import os
import time

import pytest

from backend import attention, attention_kernel
from backend.attention import PathTiming
from scheduler.stats import median
from scheduler.types import AttentionPath
from tests.needs import need_real_model

KEY = {"model": "/m.gguf", "device": "CPU", "n_threads": 1, "build": "x"}


def _timing(flash: bool, deep: float, fill: float = 5000.0) -> PathTiming:
    return PathTiming(flash=flash, fill_ms=fill, decode_shallow_ms=60.0, decode_deep_ms=deep, chunk_deep_ms=90.0)


def test_the_faster_path_on_the_reference_workload_wins_and_says_why():
    choice = attention.decide((_timing(True, 800.0), _timing(False, 410.0)), KEY)
    assert not choice.flash and choice.path is AttentionPath.DENSE
    assert "410 vs 800 ms" in choice.reason and "1024 deep" in choice.reason
    assert choice.short().startswith("flash off · measured")
    gpu = attention.decide((_timing(True, 20.0, fill=300.0), _timing(False, 45.0, fill=420.0)), KEY)
    assert gpu.flash and gpu.path is AttentionPath.FLASH


def test_forced_choices_are_respected():
    assert attention.forced_choice("auto", "f16") is None
    off = attention.forced_choice("off", "f16")
    assert not off.flash and "asked for" in off.reason
    q8 = attention.forced_choice("auto", "q8_0")
    assert q8.flash and "quantized V cache" in q8.reason
    with pytest.raises(ValueError, match="needs flash attention"):
        attention.forced_choice("off", "q4_0")
    with pytest.raises(ValueError, match="auto, on or off"):
        attention.check_flash_attn("sometimes")


QUIET = lambda: (lambda: 0.0)  # noqa: E731  (a probe on an idle machine)


def test_dense_must_win_by_a_margin_since_its_cost_grows_with_other_conversations():
    # On one thread here a probe found dense 1.02x faster on the reference workload; at 16
    # distinct conversations the engine then ran 0.81x llama-server, which runs flash.
    near = attention.decide((_timing(True, 420.0), _timing(False, 410.0)), KEY)
    assert near.flash and "less than 5%" in near.reason
    clear = attention.decide((_timing(True, 520.0), _timing(False, 410.0)), KEY)
    assert not clear.flash and "less than" not in clear.reason


def test_a_cached_verdict_is_decided_again_from_its_timings(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    timings = (_timing(True, 420.0), _timing(False, 410.0))
    attention.store(attention.AttentionChoice(False, "an older rule's verdict", timings, key=KEY))
    cached = attention.load_cached(KEY)
    assert cached is not None and cached.cached and cached.flash  # the rule now, not the old verdict


def test_the_verdict_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    calls = []

    def measure(flash: bool) -> PathTiming:
        calls.append(flash)
        return _timing(flash, 800.0 if flash else 410.0)

    first = attention.choose(key=KEY, measure=measure, meter=QUIET)
    assert calls == [True, False] and not first.cached
    again = attention.choose(key=KEY, measure=measure, meter=QUIET)
    assert calls == [True, False] and again.cached and again.flash == first.flash
    assert again.timings == first.timings
    other = attention.choose(key=KEY | {"n_threads": 2}, measure=measure, meter=QUIET)  # another key measures again
    assert calls == [True, False, True, False] and not other.cached


def test_a_verdict_measured_while_other_processes_kept_the_machine_busy_is_not_kept(tmp_path, monkeypatch):
    # On 2 threads a probe on a loaded machine timed 8-row steps at 316-683 ms (about 40 quiet)
    # and picked the path a quiet machine would not have; cached, it decided every later start.
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    calls = []

    def measure(flash: bool) -> PathTiming:
        calls.append(flash)
        return _timing(flash, 800.0 if flash else 410.0)

    busy = attention.choose(key=KEY, measure=measure, meter=lambda: (lambda: 1.2))
    assert not busy.flash and not busy.cached and "1.2 cores busy" in busy.reason
    quiet = attention.choose(key=KEY, measure=measure, meter=QUIET)  # the next start measures again
    assert calls == [True, False, True, False] and not quiet.cached and "not kept" not in quiet.reason
    kept = attention.choose(key=KEY, measure=measure, meter=QUIET)  # and now keeps it,
    assert kept.cached and kept.others_cores == 0.0  # with the load it was measured under


def _machine_busy_jiffies() -> int:
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(fields[:8]) - fields[3] - fields[4]


@pytest.mark.serial
def test_the_meter_counts_other_processes_not_this_one():
    # Against the whole machine's busy time over the same window, so other work on the machine
    # (a neighbour, a parallel test) does not decide it: this process's core is not "others".
    busy0, w0 = _machine_busy_jiffies(), time.monotonic()
    since = attention.others_meter()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.5:  # this process busy: not "others"
        pass
    others = since()
    machine = (_machine_busy_jiffies() - busy0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - w0)
    assert 0.0 <= others < machine - 0.5, (others, machine)


def test_a_path_the_device_cannot_run_is_skipped_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))

    def measure(flash: bool) -> PathTiming:
        if flash:
            raise RuntimeError("unsupported")
        return _timing(False, 400.0)

    choice = attention.choose(key=KEY, measure=measure)
    assert not choice.flash and "failed in the probe" in choice.reason


def test_only_the_cpu_flash_kernel_reports_an_attention_tile():
    on, off = attention.AttentionChoice(True, "asked for"), attention.AttentionChoice(False, "asked for")
    assert attention_kernel.tile_rows(on, "CPU") == attention_kernel.CPU_FLASH_TILE_ROWS == 64
    assert attention_kernel.tile_rows(off, "CPU") == 0
    assert attention_kernel.tile_rows(on, "Vulkan0") == 0


def test_only_the_dense_path_on_a_cpu_bounds_a_steps_attention_scores():
    on, off = attention.AttentionChoice(True, "asked for"), attention.AttentionChoice(False, "asked for")
    # 9 heads (SmolLM2-135M): 32 prompt rows beside 8,192 cells, where the measurement put the bound.
    assert attention_kernel.dense_kq_cells(off, "CPU", 9) == 32 * 8192
    assert attention_kernel.dense_kq_cells(off, "CPU", 36) == 8 * 8192  # four times the scores per row and cell
    assert attention_kernel.dense_kq_cells(on, "CPU", 9) == attention_kernel.dense_kq_cells(off, "Vulkan0", 9) == 0


# ---- the real model ------------------------------------------------------------------------------

def _prompt(seq: int, pos0: int, n: int, logits: bool = True):
    from scheduler.types import SeqSlice

    return SeqSlice(seq, pos0, tuple(range(100, 100 + n)), logits, False)


def test_a_few_rows_of_a_last_partial_tile_are_cut_off_to_run_one_at_a_time():
    # 64 + 5 rows of one prompt: the 5 go to the second call, the prompt's logits with them.
    head, tail = attention_kernel.partial_tile([_prompt(0, 300, 69)], 64, beside=1)
    assert [(s.seq_id, s.pos0, len(s.tokens), s.want_logits) for s in head] == [(0, 300, 64, False)]
    assert [(s.seq_id, s.pos0, len(s.tokens), s.want_logits) for s in tail] == [(0, 364, 5, True)]
    assert head[0].tokens + tail[0].tokens == _prompt(0, 300, 69).tokens
    # Two prompts: the tail takes the last one whole (3 rows) and 2 rows of the one before.
    head, tail = attention_kernel.partial_tile([_prompt(1, 0, 130, logits=False), _prompt(2, 40, 3)], 64, beside=0)
    assert [(s.seq_id, s.pos0, len(s.tokens), s.want_logits) for s in head] == [(1, 0, 128, False)]
    assert [(s.seq_id, s.pos0, len(s.tokens), s.want_logits) for s in tail] == [(1, 128, 2, False), (2, 40, 3, True)]


def test_a_step_stays_whole_where_the_cut_would_not_pay():
    whole = [_prompt(0, 0, 64 + 17)]  # more than a quarter tile: the partial tile is cheaper
    assert attention_kernel.partial_tile(whole, 64, beside=0) == (whole, [])
    for prompt, beside in (([_prompt(0, 0, 128)], 0),  # no partial tile
                           ([_prompt(0, 0, 40)], 0),  # no tile at all: one row at a time anyway
                           ([_prompt(0, 0, 64 + 8)], 56)):  # with the decode rows it would be tiled
        assert attention_kernel.partial_tile(prompt, 64, beside) == (prompt, [])
    assert attention_kernel.partial_tile([_prompt(0, 0, 70)], 0, beside=0) == ([_prompt(0, 0, 70)], [])


@pytest.mark.slow
@pytest.mark.serial  # the verdict is cached only on a quiet machine
def test_load_measures_both_paths_caches_the_verdict_and_reports_it(tmp_path, monkeypatch):
    need_real_model()
    from backend.llama_backend import LlamaBackend

    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    b = LlamaBackend.load(device="cpu", n_ctx=1024, n_seq_max=4, n_batch=256, n_threads=1)
    try:
        choice = b.attention
        assert len(choice.timings) == 2 and not choice.cached
        assert {t.flash for t in choice.timings} == {True, False}
        assert all(t.decode_deep_ms > 0 and t.fill_ms > 0 for t in choice.timings)
        on = next(t for t in choice.timings if t.flash)
        off = next(t for t in choice.timings if not t.flash)
        # the rule: dense only when it wins the reference workload by more than DENSE_MARGIN
        assert choice.flash == (not on.reference_ms > off.reference_ms * attention.DENSE_MARGIN)
        assert b.attention_path is (AttentionPath.FLASH if choice.flash else AttentionPath.DENSE)
        assert b.attention_tile_rows == (attention_kernel.CPU_FLASH_TILE_ROWS if choice.flash else 0)
        assert b.info["attention"] == choice.short() and "measured" in b.info["attention_reason"]
        assert b.kv_cells_used() == 0  # the probe left nothing behind
    finally:
        b.close()
    t0 = time.perf_counter()
    again = LlamaBackend.load(device="cpu", n_ctx=1024, n_seq_max=4, n_batch=256, n_threads=1)
    try:
        assert again.attention.cached and again.attention.flash == choice.flash
        assert time.perf_counter() - t0 < 10  # no probe this time
    finally:
        again.close()


@pytest.mark.slow
def test_forced_settings_and_a_quantized_v_cache_run(tmp_path, monkeypatch):
    need_real_model()
    from backend.llama_backend import LlamaBackend
    from scheduler.types import BatchPlan, SeqSlice

    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    for kwargs, flash in (({"flash_attn": "off"}, False), ({"flash_attn": "on"}, True),
                          ({"cache_type_v": "q8_0"}, True)):
        b = LlamaBackend.load(device="cpu", n_ctx=512, n_seq_max=2, n_batch=128, **kwargs)
        try:
            assert b.attention.flash is flash and not b.attention.timings  # nothing measured
            toks = tuple(b.tokenize("Hello there, how are you?"))
            result = b.decode(BatchPlan(0, (SeqSlice(0, 0, toks, True, False),), len(toks)))
            assert result.outcome.value == "ok"
        finally:
            b.close()
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="needs flash attention"):
        LlamaBackend.load(device="cpu", n_ctx=512, n_seq_max=2, flash_attn="off", cache_type_v="q4_0")


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("flash", ["off", "on"])
def test_the_cost_model_predicts_held_out_deep_steps_within_a_quarter(flash):
    """Calibrate, then run subagents forked from a 1,000-token context: each step is predicted
    before it is measured (held out), then learned from, as the engine does while it runs. One
    thread and CPU time, so what is measured is the step's work and not a busy machine's other
    processes (every step computes on the calling thread)."""
    need_real_model()
    errors = _held_out_errors(flash)
    if median(errors) > 0.25:
        # Once in a few full runs on a shared VM a whole round came out offset by the same ~45 %
        # (calibration and run disagreeing wholesale, not step by step): a second, independent
        # calibrate-and-run round must then meet the bound.
        errors = _held_out_errors(flash)
    assert len(errors) >= 20
    assert median(errors) <= 0.25, sorted(errors)


def _held_out_errors(flash: str) -> list[float]:
    from backend.llama_backend import LlamaBackend
    from magnitude_bench.common import CPU_CLOCK, StepTimer, prompt_tokens
    from magnitude_tui.engine.core import Engine
    from scheduler.types import Request, SamplingParams, plan_kpos

    llama = LlamaBackend.load(device="cpu", n_ctx=4096, n_seq_max=8, n_batch=512, n_threads=1, flash_attn=flash)
    try:
        view = StepTimer(llama, CPU_CLOCK)  # what the cost model learns from
        engine = Engine(view, policy="target:50", coalesce_ms=0, clock=CPU_CLOCK)
        engine.calibrate()
        parent = prompt_tokens(llama, 1000, salt=9)
        engine.submit(Request("p", "p", (), SamplingParams(max_tokens=1), prompt_tokens=parent))
        engine.run_until_idle()
        for i in range(6):
            engine.submit(Request(f"k{i}", f"k{i}", (), SamplingParams(max_tokens=24, ignore_eos=True), fork_from="p",
                                  prompt_tokens=parent + prompt_tokens(llama, 40, salt=60 + i)))
        sched = engine.scheduler
        errors, original = [], sched.schedule

        def predicting_schedule(now=0.0):
            plan = original(now)
            if plan is not None:
                kpos = plan_kpos(plan, sched.attention, sched.kv.cells_used())
                predicting_schedule.predicted = sched.cost.predict(plan.n_decode, plan.n_prefill, kpos)
            return plan

        sched.schedule = predicting_schedule
        while engine.has_work():
            report = engine.step()
            if report is not None and report.decode_rows + report.prefill_rows:
                measured_ms = view.decode_ms[-1]
                errors.append(abs(predicting_schedule.predicted - measured_ms) / measured_ms)
        for sid in ("p", *(f"k{i}" for i in range(6))):
            engine.close_session(sid)
        engine.run_until_idle()
        assert engine.is_empty(), engine.leaks()
    finally:
        llama.close()
    return errors


@pytest.mark.slow
def test_devices_reports_the_attention_choice_and_why(tmp_path, monkeypatch):
    need_real_model()
    from typer.testing import CliRunner

    from backend.llama_load import build_id, default_model_path
    from magnitude_tui.cli import app

    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    from backend.factory import BackendConfig

    # `devices --attention` probes the app's default context, so its pool of other conversations
    key = attention.cache_key(model_path=default_model_path(), device="CPU", n_threads=1, n_ubatch=512,
                              build=build_id(), pool=attention.pool_size(BackendConfig("llama").ctx_size))
    attention.store(attention.decide((_timing(True, 800.0), _timing(False, 410.0)), key))  # as measured before
    result = CliRunner().invoke(app, ["devices", "--attention", "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "flash attention off: measured 410 vs 800 ms" in result.output and "(cached)" in result.output
    assert "flash on : fill 5000 ms" in result.output and "flash off: fill 5000 ms" in result.output


def test_a_cached_file_without_both_paths_timed_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    attention.store(attention.AttentionChoice(True, "one path only", (_timing(True, 420.0),), key=KEY))
    assert attention.load_cached(KEY) is None
