"""Draft rows priced from the steps the engine timed (scheduler/row_price.py): the measured price
replaces a wrong cost-model coefficient, so the policy drafts long where rows are cheap and stops
where they cost a whole step."""

from __future__ import annotations

import pytest

from backend.fake import DEFAULT_REPLY
from backend.simulated import HardwareProfile, SimulatedBackend
from scheduler.row_price import MAX_WIDTHS, MIN_DRAFTED, MIN_PLAIN, RowPrice
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text


def test_the_price_is_the_median_extra_share_of_a_plain_step_per_draft_row():
    price = RowPrice()
    for _ in range(MIN_PLAIN):
        price.observe(1, 0, 0, 10.0)
    price.observe(1, 4, 0, 22.0)  # 4 rows added 12 ms: 0.3 of the plain step each
    price.observe(1, 2, 0, 16.0)
    price.observe(1, 4, 0, 90.0)  # one step stalled by the machine: the median ignores it
    assert price.share(1) is None  # not enough drafted steps yet
    price.observe(1, 1, 0, 13.0)
    assert price.share(1) == pytest.approx(0.3)
    assert price.share(4) is None  # another width has its own price
    price.observe(1, 4, 7, 500.0)  # prompt rows, or a step not timed, teach nothing
    price.observe(1, 4, 0, 0.0)
    assert price.share(1) == pytest.approx(0.3)


def _priced(price, width):
    for _ in range(MIN_PLAIN):
        price.observe(width, 0, 0, 10.0)
    for _ in range(MIN_DRAFTED):
        price.observe(width, 1, 0, 15.0)


def test_the_width_in_use_keeps_its_price_while_many_others_come_and_go():
    """A 16-sequence batch drains through every width below 16 and starts again at 16: the width
    observed longest ago is forgotten, not the first one seen (which may be the one in use)."""
    price = RowPrice()
    _priced(price, 16)
    widths = [w for w in range(1, MAX_WIDTHS + 3) if w != 16]  # two more than it remembers
    for width in widths:
        for _ in range(MIN_PLAIN):
            price.observe(width, 0, 0, 10.0)
        price.observe(16, 0, 0, 10.0)  # the batch's own width keeps being timed
    assert price.share(16) == pytest.approx(0.5) and not price.wants_plain(16)
    # The two observed longest ago went (their plain steps are timed again); the rest are kept.
    assert [w for w in widths if price.wants_plain(w)] == [1, 2]


def run(mode, prior_row, true_row, n=1):
    """`n` sequences copying themselves; the engine's cost model starts from a prior where a row
    costs `prior_row` of a 10 ms one-row step, while the steps really cost `true_row` a row."""
    prior = HardwareProfile("scripted", fixed_ms=10.0 * (1 - prior_row), decode_ms=10.0 * prior_row, prefill_ms=1.0)
    backend = SimulatedBackend(prior, n_ctx=32768, n_batch=2048, reply=DEFAULT_REPLY,
                               step_ms=lambda rows, prefill: 10.0 * (1 - true_row) + 10.0 * true_row * rows + prefill)
    engine, _ = engine_for(backend, policy="target:50", spec=mode)
    for i in range(n):
        engine.submit(chat(f"r{i}", f"s{i}", "hi", max_tokens=300))
    reports = engine.run_until_idle()
    assert_clean(engine, *(f"s{i}" for i in range(n)))
    late = reports[len(reports) // 2:]
    return dict(ms=(reports[-1].t - reports[0].t) * 1000, late_rows=sum(r.draft_rows for r in late),
                late_drafting=sum(1 for r in late if r.draft_rows), engine=engine,
                texts={rid: text(u) for rid, u in by_request(reports).items()})


def test_rows_that_cost_a_whole_step_stop_drafting_although_the_cost_model_prices_them_cheap():
    """The prior says a row costs 0.1 of a step; it costs a whole one. Measured, the price
    converges to 1.0 and row_can_pay stops the drafts (the cost model alone kept drafting 8-row
    copies to the end, buying nothing)."""
    off, auto = run("off", 0.1, 1.0), run("auto", 0.1, 1.0)
    assert auto["texts"] == off["texts"]
    assert auto["engine"].scheduler.speculator.row_price.share(1) == pytest.approx(1.0, abs=0.02)
    assert auto["late_rows"] == 0
    assert auto["ms"] <= off["ms"] * 1.03


@pytest.mark.parametrize("prior_row", [0.6, 0.1])
def test_rows_that_cost_a_third_of_a_step_draft_long_whatever_the_prior(prior_row):
    """Rows at 0.3 of a step and a copy accepted throughout: from a prior at 0.6 (it drafted 1-2
    rows a step, so the fit saw too little to move) or at 0.1, the measured price converges to
    0.3 and the copy is verified K_MAX rows at a time."""
    off, auto = run("off", prior_row, 0.3), run("auto", prior_row, 0.3)
    assert auto["texts"] == off["texts"]
    assert auto["engine"].scheduler.speculator.row_price.share(1) == pytest.approx(0.3, abs=0.02)
    assert auto["late_rows"] >= 7 * auto["late_drafting"] > 0
    assert off["ms"] / auto["ms"] >= 2.0


def test_four_sequences_at_rows_costing_most_of_a_step_do_not_lose():
    off, auto = run("off", 0.1, 0.6, n=4), run("auto", 0.1, 0.6, n=4)
    assert auto["texts"] == off["texts"]
    assert off["ms"] / auto["ms"] >= 0.97  # the acceptance criterion: never below 0.97x off


def test_a_width_drafted_at_from_its_first_step_still_measures_its_price():
    """The prompt already holds the reply, so the lookup guesses right from the first step and the
    cost model's prior (a row at 0.1 of a step) would draft every step: no plain step would ever be
    timed to price a drafted one against. The first MIN_PLAIN steps at the width go without drafts,
    the price converges to what a row costs (a whole step) and the drafts stop."""
    prior = HardwareProfile("scripted", fixed_ms=9.0, decode_ms=1.0, prefill_ms=1.0)
    backend = SimulatedBackend(prior, n_ctx=32768, n_batch=2048, reply=DEFAULT_REPLY,
                               step_ms=lambda rows, prefill: 10.0 * rows + prefill)
    engine, _ = engine_for(backend, policy="target:50", spec="auto")
    engine.submit(chat("r0", "s0", DEFAULT_REPLY * 12, max_tokens=200))
    reports = engine.run_until_idle()
    assert_clean(engine, "s0")
    decoding = [r for r in reports if r.decode_rows and not r.prefill_rows]
    assert [r.draft_rows for r in decoding[:MIN_PLAIN]] == [0] * MIN_PLAIN
    assert any(r.draft_rows for r in decoding[MIN_PLAIN:MIN_PLAIN + 4])  # then it drafts, and learns
    assert engine.scheduler.speculator.row_price.share(1) == pytest.approx(1.0, abs=0.02)
    assert sum(r.draft_rows for r in decoding[len(decoding) // 2:]) == 0


def test_a_drafted_step_is_compared_with_plain_steps_as_they_would_be_at_its_depth():
    # The cost model says a plain step of 8 rows takes 10 ms plus 5 ms per thousand positions
    # attended. Plain steps timed deep (kpos 4: expected 30 ms) took 36 ms, 1.2x the model; the
    # next batch starts shallow (kpos 0: expected 10 ms, so 12 ms as the machine runs), where a
    # drafted step of 4 rows took 16.8 ms: 0.1 of a plain step a row. Against the raw 36 ms it
    # would look free.
    def predict(kpos):
        return 10.0 + 5.0 * kpos

    price = RowPrice()
    for _ in range(MIN_PLAIN):
        price.observe(8, 0, 0, 36.0, kpos=4.0, predict=predict)
    for _ in range(4):
        price.observe(8, 4, 0, 16.8, kpos=0.0, predict=predict)
    assert price.share(8) == pytest.approx(0.1)
    raw = RowPrice()  # without the model's depth: compared with the 36 ms steps
    for _ in range(MIN_PLAIN):
        raw.observe(8, 0, 0, 36.0)
    for _ in range(4):
        raw.observe(8, 4, 0, 16.8)
    assert raw.share(8) == 0.0
