"""The benchmark pages against the raw results committed under docs/benchmarks/: every generated
section is what its JSON gives, so no figure on them is typed by hand."""

from __future__ import annotations

import json
import re

import pytest

from magnitude_bench.report import PAGES, SECTION, render, stale
from magnitude_bench.report_format import fmt
from magnitude_bench.report_raw import RAW_DIR, Results
from magnitude_bench.report_summary import HEADLINES


def test_every_page_matches_its_raw_results():
    for page in PAGES:
        text = page.read_text()
        assert render(text, Results()) == text, (
            f"{page.name} differs from docs/benchmarks/: run `.venv/bin/magnitude-bench report` "
            "(never edit a generated section by hand)")


def test_the_main_page_opens_with_the_summary_and_every_section_names_a_committed_result():
    text = PAGES[0].read_text()
    kinds = [m["kind"] for m in SECTION.finditer(text)]
    assert kinds[0] == "summary"
    assert text.index("## Summary") < text.index("## Method") < text.index("## Warm resume")
    results = Results()
    for page in PAGES:
        for m in SECTION.finditer(page.read_text()):
            for key in m["keys"].split():
                assert results.path(key).exists()


def test_a_changed_figure_in_a_raw_result_shows_as_a_stale_page(tmp_path):
    for f in RAW_DIR.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert stale(folder=tmp_path) == []
    shown = Results(tmp_path).path("resume")  # the file the page reads for the key (the newest run)
    doc = json.loads(shown.read_text())
    warm = next(r for r in doc["tables"]["time to first token after the resume (alternating, median)"]
                if r["mode"] == "warm")
    warm["x_of_cold"] = 0.5
    shown.write_text(json.dumps(doc))
    assert PAGES[0] in stale(folder=tmp_path)
    summary = render("<!-- generated: summary -->\n<!-- end -->", Results(tmp_path))
    row = next(ln for ln in summary.splitlines() if "--resume" in ln)
    assert "| 0.5 | ≤ 0.2 | no |" in row


def test_a_newer_timestamped_result_replaces_the_figures_of_its_key(tmp_path):
    src = json.loads((RAW_DIR / "resume.json").read_text())
    (tmp_path / "resume.json").write_text(json.dumps(src))
    newer = json.loads(json.dumps(src))
    newer["tables"]["time to first token after the resume (alternating, median)"][1]["x_of_cold"] = 0.031
    (tmp_path / "resume-20991231-235959.json").write_text(json.dumps(newer))
    raw = Results(tmp_path).get("resume")
    assert raw.file == "resume-20991231-235959.json" and raw.date == "2099-12-31 23:59 UTC"


def test_every_headline_figure_is_in_its_raw_result():
    """The summary quotes figures as recorded: each ratio is a value of its JSON, unless the headline
    says how it derives it from the rows (a result that records no ratio)."""
    results = Results()
    for make in HEADLINES:
        for h in make(results):
            blob = json.dumps(h.raw.doc)
            for v in re.findall(r"[\d,]+\.?\d*", fmt(h.ratio) if not hasattr(h.ratio, "text") else h.ratio.text):
                number = v.replace(",", "")
                assert number in blob or h.derived, (h.what, v)


def test_prose_quotes_no_figure_that_is_not_in_a_generated_table():
    """Outside the generated sections, the main page states no measured figure of its own."""
    text = PAGES[0].read_text()
    prose = SECTION.sub("", text)
    generated = "".join(m.group(0) for m in SECTION.finditer(text))
    decimals = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", prose))
    assert {d for d in decimals if d not in generated} == set()


@pytest.mark.parametrize("recorded, shown", [(0.988, "0.988"), (103252.4, "103,252.4"), (None, "-"), (True, "yes")])
def test_figures_are_shown_as_recorded(recorded, shown):
    assert fmt(recorded) == shown


def test_benchmarks_sh_reproduces_every_result_the_pages_show():
    """Every raw result a page shows has its command in scripts/benchmarks.sh, or the script names
    its file among those it does not rerun (the issue 28 files made by scripts/callgrind_compare.py,
    scripts/fp16_probe_compare.py and the probe's one-liner). A key aliased to an older file of a
    key the script runs (the same command on an earlier build) counts as that key."""
    script = (PAGES[0].parents[1] / "scripts" / "benchmarks.sh").read_text()
    keys_run = set(re.findall(r"^bench (?:quick|full|history) ([\w-]+) ", script, re.M))
    keys_run |= {"spec-control"} if "combine" in script and "spec-control" in script else set()
    shown = {key for page in PAGES for m in SECTION.finditer(page.read_text()) for key in m["keys"].split()}
    shown |= {h.raw.key for make in HEADLINES for h in make(Results())}
    results = Results()
    aliases = json.loads((results.folder / "provenance.json").read_text())["aliases"]
    not_rerun = {k for k in shown if f"{k}.json" in script}
    older = {k for k in shown if re.sub(r"-\d{8}-\d{6}\.json$", "", aliases.get(k, "")) in keys_run}
    assert shown - keys_run - not_rerun - older == set()
