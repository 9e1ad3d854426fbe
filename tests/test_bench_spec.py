"""bench spec: every mode and width measured side by side, greedy replies identical to `off`, the
acceptance trace recorded on one backend and replayed on a simulated GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backend.factory import BackendConfig, build_backend
from magnitude_bench.common import prompt_tokens, save_result
from magnitude_bench.harness import Step, Trace
from magnitude_bench.plots import plot_spec
from magnitude_bench.spec import SpecBenchConfig, _row, rotated, run_spec
from magnitude_bench.spec_report import CONTROL, merge_reps
from magnitude_bench.spec_tasks import Task
from magnitude_bench.spec_trace import Guess, RecordingSource, TraceDrafts
from scheduler.drafts import DraftKind
from scheduler.ngram import NgramSource


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


class _Fixed:
    """A draft source that always proposes the same tokens."""

    kind = DraftKind.NGRAM

    def __init__(self, draft: list[int]) -> None:
        self.draft = draft

    def propose(self, key, tokens, k):
        return self.draft[:k]

    def draft_ms(self, k, n):
        return 0.0

    def forget(self, key):
        pass


def test_recording_judges_each_guess_against_what_the_sequence_commits_later():
    rec = RecordingSource(_Fixed([5, 6, 7]))
    rec.propose(0, [1, 2], 3)
    rec.propose(0, [1, 2, 5], 3)  # one token seen so far and it matched: not judged yet
    assert rec.guesses == []
    rec.propose(0, [1, 2, 5, 6, 9], 3)  # 5, 6 matched, then 9 instead of 7
    assert rec.guesses[0] == Guess(asked=3, proposed=3, matched=2)
    rec.propose(0, [1, 2, 5, 6, 9, 5, 6, 7, 8], 2)
    assert rec.guesses[1:] == [Guess(3, 3, 0), Guess(3, 3, 3)]  # at 3 it saw 6 9 5; at 5, 5 6 7
    rec.forget(0)  # the last guess (at 9) was never judged: dropped, not counted as a miss
    assert len(rec.guesses) == 3


def test_recording_keeps_the_match_length_behind_each_guess_and_the_replay_reports_it():
    from backend.fake import FakeBackend
    from scheduler.ngram import NgramSource

    rec = RecordingSource(NgramSource())
    block = list(range(100, 120))
    tokens = [50] + block + [99] + block[:9]
    assert rec.propose(0, tokens, 3) == block[9:12] and rec.match_length(0) == 9
    rec.propose(0, tokens + [7], 3)  # the copy broke at once: judged, with the evidence it had
    assert rec.guesses == [Guess(3, 3, 0, 9)]
    src = TraceDrafts(FakeBackend(n_seq_max=1), DraftKind.NGRAM, [Guess(8, 4, 4, 12), Guess(8, 2, 0, 2)])
    src._cursor[0] = 0
    src.propose(0, [], 8)
    assert src.match_length(0) == 12
    src.propose(0, [], 8)
    assert src.match_length(0) == 2


def test_trace_drafts_replay_how_many_guesses_matched():
    from backend.fake import FakeBackend

    backend = FakeBackend(n_seq_max=2)
    truth = backend.next_tokens(0, 4)
    src = TraceDrafts(backend, DraftKind.NGRAM, [Guess(8, 4, 2), Guess(8, 0, 0), Guess(8, 3, 3)])
    src._cursor[0] = 0
    first = src.propose(0, [], 8)
    assert first[:2] == truth[:2] and first[2] != truth[2] and first[3] != truth[3] and len(first) == 4
    assert src.propose(0, [], 8) == []
    assert src.propose(0, [], 2) == truth[:2]  # a shorter ask takes the first tokens of the guess


def test_aggregate_runs_to_the_last_step_and_the_full_batch_rate_to_the_first_sequence_end():
    # Two sequences, both generating from t=1; "a" ends at t=3, "b" goes on alone to t=5 (steps
    # of 1 s). Aggregate: the 6 tokens after t=1 over the 4 s to the last step; the full-batch
    # rate: the 4 tokens of the steps up to a's end over those 2 s.
    steps = [(1.0, 2, 2, 0, 0), (2.0, 2, 2, 0, 0), (3.0, 2, 2, 0, 0), (4.0, 1, 1, 0, 0), (5.0, 1, 1, 0, 0)]
    run = _run(steps, {"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 5.0}, {"a": 3, "b": 5})
    r = _row(run)
    assert r["agg_tok_s"] == 6 / 4 and r["full_tok_s"] == 4 / 2
    # Ending together, the two are the same window.
    together = _run(steps[:3], {"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 3.0}, {"a": 3, "b": 3})
    assert _row(together)["full_tok_s"] == _row(together)["agg_tok_s"] == 2.0


def _run(steps, first: dict, done: dict, tokens: dict) -> Trace:
    """A finished run's trace: its steps as (t, tokens, decode rows, draft rows, accepted), and each
    sequence's first token time, end and token count."""
    tr = Trace(done=done, steps=[Step(t, 0.0, 0.0, None, d, 0, n, drafted, accepted, 0, 0)
                                 for t, n, d, drafted, accepted in steps])
    for rid, t in first.items():
        tr.tokens[rid] = [t] * tokens[rid]
    return tr


def test_the_modes_take_turns_so_that_none_always_runs_after_the_same_one():
    modes = ("off", "ngram", "auto")
    orders = [rotated(modes, rep) for rep in range(6)]
    assert orders[0] == modes and len(set(orders)) == 6  # every ordering once, the given one first
    assert rotated(modes, 6) == modes
    before_auto = {o[o.index("auto") - 1] for o in orders[:2] if o.index("auto") > 0}
    assert before_auto == {"off", "ngram"}  # two repetitions already put auto after each


def test_simulated_spec_bench_measures_every_mode_and_replays_the_trace(tmp_path):
    cfg = SpecBenchConfig(widths=(1, 3), tasks=("repetitive", "chat"), max_tokens=24, sim_profile="rx9070xt",
                          reps=2)
    res = run_spec(BackendConfig(kind="simulated:cpu2core"), cfg)
    real, sim, traces = res.tables.values()  # no peer table without a peer
    assert {(r["task"], r["seqs"], r["mode"]) for r in real} == {
        (t, w, m) for t in cfg.tasks for w in cfg.widths for m in cfg.modes}
    for r in real:
        assert r["same_text_as_off"] in (None, True), r  # speculation never changes a greedy reply
        assert r["per_seq_tok_s"] > 0 and r["agg_tok_s"] > 0
    draft = [r for r in real if r["mode"] == "draft"]
    assert all(r["acceptance"] == 1.0 and r["tokens_per_step"] > 2 for r in draft)  # scripted: all right
    assert {t["source"] for t in traces} == {"ngram", "draft"} and all(t["guesses"] > 0 for t in traces)
    assert [t["replies"] > 0 for t in traces] == [t["source"] == "ngram" for t in traces]  # lookup only
    assert len(sim) == len(real)
    # Replayed on a GPU-like profile (a step is mostly its fixed cost), drafts that are always
    # right make several tokens a step; auto never does worse than off.
    gpu = {(r["task"], r["seqs"], r["mode"]): r for r in sim}
    assert gpu[("repetitive", 1, "draft")]["x_off_agg"] > 2.0
    assert gpu[("repetitive", 1, "draft")]["acceptance"] == 1.0
    assert all(r["x_off_agg"] >= 0.97 for r in sim if r["mode"] == "auto")
    assert res.data["targets"]["simulated_repetitive_auto_x_off"]
    assert all(r["x_off_full"] is not None for r in real + sim if r["mode"] != "off")
    assert res.data["targets"]["auto_min_x_off_full"] is not None
    assert save_result(res, tmp_path, plot_spec)["png"].exists()


@pytest.mark.slow
def test_tiny_real_spec_bench_is_well_formed():
    cfg = SpecBenchConfig(widths=(1,), tasks=("chat",), modes=("off", "ngram"), max_tokens=6, peer=False)
    res = run_spec(BackendConfig(kind="llama", device="cpu", n_threads=1), cfg)
    real = next(iter(res.tables.values()))
    assert [r["mode"] for r in real] == ["off", "ngram"]
    assert real[1]["same_text_as_off"] is True


def test_a_failing_peer_keeps_the_engines_rows():
    def broken_peer(*args):
        raise RuntimeError("llama-server crashed")

    cfg = SpecBenchConfig(widths=(1,), tasks=("chat",), modes=("off", "ngram"), max_tokens=4)
    res = run_spec(BackendConfig(kind="simulated:cpu2core"), cfg, peer=broken_peer)
    real, peer = list(res.tables.values())[:2]
    assert [r["mode"] for r in real] == ["off", "ngram"]
    assert "llama-server crashed" in peer[0]["note"]


def test_bench_throughput_runs_the_engine_with_the_spec_it_is_given():
    # `bench throughput --spec`: the same fixed work (EOS ignored), verified drafts when asked for.
    from backend.fake import FakeBackend
    from magnitude_bench.common import prompt_tokens
    from magnitude_bench.throughput import engine_run

    backend = FakeBackend(n_seq_max=4)
    prompts = [prompt_tokens(backend, 32, salt=i + 1) for i in range(2)]
    off = engine_run(backend, prompts, 48, "fixed:64")
    ngram = engine_run(backend, prompts, 48, "fixed:64", spec="ngram")
    assert off["made"] == ngram["made"] == 2 * 48
    assert ngram["steps"] < off["steps"]  # the fake reply repeats itself: drafts were accepted


def test_each_mode_is_compared_with_the_off_run_of_its_own_repetition():
    # Repetition 0 ran on a busy machine (every mode at half speed), repetition 1 on a quiet one.
    # Paired, auto is 1.1x off in both; the ratio of the medians would mix the two machines.
    def row(mode, rep, rate):
        return {"task": "chat", "seqs": 2, "mode": mode, "rep": rep, "per_seq_tok_s": rate, "agg_tok_s": rate,
                "full_tok_s": rate, "acceptance": None, "tokens_per_step": 1.0, "draft_rows_per_step": 0.0,
                "tokens": 10, "same_text_as_off": None}

    rows = [row("off", 0, 50.0), row("auto", 0, 55.0), row("off", 1, 100.0), row("auto", 1, 110.0),
            row("off", 2, 60.0), row("auto", 2, 200.0)]  # one outlier pair
    merged = {r["mode"]: r for r in merge_reps(rows)}
    assert merged["auto"]["x_off_agg"] == merged["auto"]["x_off_full"] == merged["auto"]["x_off_per_seq"] == 1.1
    assert merged["off"]["x_off_agg"] == 1.0
    assert merged["auto"]["agg_tok_s"] == 110.0  # the rates themselves are still medians


def test_a_short_batch_repeats_until_off_made_enough_tokens_and_no_more_than_three_times_reps():
    cfg = SpecBenchConfig(reps=2, min_tokens=100)

    def count(per_run: int, extend: bool = True) -> int:
        made = done = 0
        while done < cfg.reps_at(made, done, extend):
            made, done = made + per_run, done + 1
        return done

    assert count(60) == 2  # 120 tokens after the two asked for: enough
    assert count(30) == 4  # 30, 60, 90, 120
    assert count(1) == 6  # never enough: three times the repetitions asked for
    assert count(1, extend=False) == 2  # a run without `off` (the draft model's engine) keeps `reps`
    # In a run: a 4-token chat at one sequence repeats until 12 tokens, 3 repetitions.
    res = run_spec(BackendConfig(kind="simulated:cpu2core"),
                   SpecBenchConfig(widths=(1,), tasks=("chat",), modes=("off", "ngram"), max_tokens=4, min_tokens=12))
    assert res.data["repetitions"] == {"chat": {1: 3}}


def test_each_task_writes_its_own_reply_length_unless_max_tokens_says_otherwise():
    cfg = SpecBenchConfig(widths=(1, 2), tasks=("repetitive", "quoting", "chat"), modes=("off", "ngram"))
    assert [cfg.reply_tokens(Task(t)) for t in cfg.tasks] == [512, 96, 64] and cfg.longest_reply() == 512
    assert SpecBenchConfig(max_tokens=7).reply_tokens(Task.REPETITIVE) == 7
    # The stand-in never ends a reply: each runs to its task's length, and the simulated GPU's too.
    res = run_spec(BackendConfig(kind="simulated:cpu2core"), replace(cfg, tasks=("chat",)))
    assert res.data["reply_tokens"] == {"chat": {0: 64, 1: 64}}
    real, sim = list(res.tables.values())[:2]
    assert {r["tokens"] for r in real} == {64, 128} and {r["tokens"] for r in sim} == {64, 128}


def test_the_simulated_gpu_ends_each_reply_where_the_real_one_ended():
    from magnitude_bench.spec import _Bench, _task

    backend = build_backend(BackendConfig(kind="simulated:rx9070xt", n_seq_max=3))
    cfg = SpecBenchConfig(widths=(3,), tasks=("quoting",), modes=("off", "ngram"), max_tokens=40)
    bench = _Bench(backend, None, cfg)
    prompts = [prompt_tokens(backend, 30, salt=i + 1) for i in range(3)]
    lengths: dict[int, int] = {}
    rows = _task(bench, Task.QUOTING, prompts, {DraftKind.NGRAM: NgramSource()}, lambda s: None,
                 caps={0: 17, 1: 40, 2: 25}, lengths=lengths)
    assert lengths == {0: 17, 1: 40, 2: 25}  # each `off` reply's length, as capped
    assert {r["mode"]: r["tokens"] for r in rows} == {"off": 82, "ngram": 82}
    # Without caps every reply runs to max_tokens.
    assert {r["tokens"] for r in _task(bench, Task.QUOTING, prompts, {DraftKind.NGRAM: NgramSource()},
                                       lambda s: None)} == {120}


def test_each_mode_goes_on_from_what_its_own_runs_taught():
    # One engine runs every mode in turn; forced lookup's verifications must not set the estimates
    # or the row price `auto` starts from.
    from types import SimpleNamespace

    from magnitude_bench.spec import _ModeMemory
    from scheduler.speculator import Speculator

    spec = Speculator()
    switched = []
    engine = SimpleNamespace(scheduler=SimpleNamespace(speculator=spec), set_spec=switched.append)
    memory = _ModeMemory()
    memory.switch(engine, "off")
    memory.switch(engine, "ngram")
    key = (DraftKind.NGRAM, False, False)
    for _ in range(10):
        spec.overall[key].observe(0, True)  # forced lookup: its guesses rejected
    taught = spec.overall[key].p(0.5)
    assert taught < 0.2
    memory.switch(engine, "auto")
    assert spec.overall[key].p(0.5) == 0.5  # auto starts from the prior
    spec.overall[key].observe(1, False)
    memory.switch(engine, "ngram")
    assert spec.overall[key].p(0.5) == taught  # ngram goes on from its own
    memory.switch(engine, "auto")
    assert spec.overall[key].p(0.5) > 0.5  # and auto from its one hit
    assert switched == ["off", "ngram", "auto", "ngram", "auto"]


def test_the_control_runs_off_again_in_each_repetition_and_reports_what_identical_work_reads():
    # On a machine whose clock drifts between minutes, `off` run twice reads the spread of the
    # measurement itself; on a deterministic clock identical work must read exactly 1.
    cfg = SpecBenchConfig(widths=(1, 2), tasks=("chat",), modes=("off", "auto"), max_tokens=6, reps=2,
                          min_tokens=1, control=True, peer=False)
    res = run_spec(BackendConfig(kind="simulated:cpu2core"), cfg)
    real, sim, _ = res.tables.values()
    again = [r for r in real if r["mode"] == CONTROL]
    assert [r["seqs"] for r in again] == [1, 2]
    for r in again:
        assert r["x_off_full"] == r["x_off_per_seq"] == r["x_off_agg"] == 1.0
        assert r["same_text_as_off"] is True
    assert CONTROL not in {r["mode"] for r in sim}  # the simulated clock repeats exactly: no control
    assert res.data["targets"]["control_x_off"] == [1.0, 1.0]
    assert any("identical work" in n for n in res.notes)
    without = run_spec(BackendConfig(kind="simulated:cpu2core"), replace(cfg, control=False))
    assert CONTROL not in {r["mode"] for r in next(iter(without.tables.values()))}
    assert without.data["targets"]["control_x_off"] is None
