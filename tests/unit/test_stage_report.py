"""srollout.report: markdown/rich tables, report.md, figures (Agg, written as PNG)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from srollout.report.markdown import Section, doc_link, figure, write_report
from srollout.report.tables import format_value, mean_pm, num, pct, to_markdown, to_rich


def test_format_value() -> None:
    assert format_value(0.123456) == "0.123"
    assert format_value(0.123456, 2) == "0.12"
    assert format_value(1.4e-5) == "1.4e-05"
    assert format_value(0.0) == "0.000"
    assert format_value(math.nan) == "—" and format_value(None) == "—"
    assert format_value(True) == "yes" and format_value(12) == "12"


def test_share_number_and_mean_std_cells() -> None:
    assert pct(0.1234) == "12.3 %" and pct(-0.25) == "-25.0 %"
    assert num(12345.678) == "12,345.7" and num(2 / 3, 3) == "0.667"
    assert mean_pm(0.5, 0.25, 100) == "50.0 ± 25.0" and mean_pm(2.0, 0.0, digits=0) == "2 ± 0"
    assert pct(None) == pct(math.nan) == num(math.nan) == mean_pm(math.nan, 1.0) == "—"


def test_what_if_table_in_markdown() -> None:
    from srollout.report.what_if import table_markdown

    table = pl.DataFrame(
        {
            "method": ["trajectory gate", "DAPO"],
            "setting": ["stall W 3 from 5", "filter and refill"],
            "decisions": [4, 0],
            "right": [2, 0],
            "precision": [0.5, math.nan],
            "precision_low": [0.068, math.nan],
            "precision_high": [0.932, math.nan],
            "steps_saved": [0.002, 0.0],
            "tokens_saved": [math.nan, 0.0],
            "note": ["stops", "after the rollout"],
        }
    )
    assert table_markdown(table).splitlines() == [
        "| method | setting | decisions | right | precision [95 % CI] | steps saved | tokens saved "
        "| note |",
        "|---|---|---|---|---|---|---|---|",
        "| trajectory gate | stall W 3 from 5 | 4 | 2 | 0.500 [0.068, 0.932] | 0.2 % | — | stops |",
        "| DAPO | filter and refill | 0 | 0 | — | 0.0 % | 0.0 % | after the rollout |",
    ]


def test_markdown_table_escapes_pipes_and_bolds_rows() -> None:
    df = pl.DataFrame({"rule": ["r1", "r3"], "d_L": [0.12, 0.05], "note": ["a|b", None]})
    md = to_markdown(df, bold_rows=[0])
    assert md.splitlines() == [
        "| rule | d_L | note |",
        "|---|---|---|",
        "| **r1** | **0.120** | **a\\|b** |",
        "| r3 | 0.050 | — |",
    ]
    assert to_markdown(df, columns=["d_L"], digits=1).splitlines()[2] == "| 0.1 |"


def test_rich_table_highlights_the_chosen_row() -> None:
    df = pl.DataFrame({"rule": ["r1", "r1"], "d_L": [0.1, 0.12]})
    table = to_rich(df, title="sweep", highlight_rows=[1])
    assert (
        table.row_count == 2 and table.rows[1].style == "bold green" and table.rows[0].style is None
    )
    assert [c.justify for c in table.columns] == ["left", "right"]


def test_write_report_links_figures_relative_to_the_run_dir(tmp_path: Path) -> None:
    png = tmp_path / "pareto.png"
    png.write_bytes(b"")
    path = write_report(
        tmp_path,
        "srollout sweep",
        [
            Section("Sweep", "| a |\n|---|\n| 1 |\n"),
            Section("Figure", figure(png, tmp_path, "Pareto")),
        ],
        "- input: x",
    )
    text = path.read_text()
    assert path == tmp_path / "report.md"
    assert text.startswith("# srollout sweep\n")
    assert "- input: x" in text and "## Sweep" in text and "![Pareto](pareto.png)" in text


def test_doc_link_names_the_page_and_section_with_githubs_anchor() -> None:
    # lower case, backticks, colon and parentheses dropped, spaces to hyphens (hyphens kept)
    assert doc_link("ab-rollout.md", "`--audit F`: the audited arms") == (
        "[docs/ab-rollout.md, “`--audit F`: the audited arms”]"
        "(docs/ab-rollout.md#--audit-f-the-audited-arms)"
    )
    assert doc_link("gates.md", "DAPO and GRESO arms (rollout-only)").endswith(
        "(docs/gates.md#dapo-and-greso-arms-rollout-only)"
    )


def test_figures_are_png(tmp_path: Path) -> None:
    from srollout.report import figures

    corr = pl.DataFrame(
        {
            "K": [5, 5, 10, 10],
            "metric": ["prefix_edit_distance_mean", "termination_fraction"] * 2,
            "n": [4] * 4,
            "spearman_rho": [0.3, -0.2, 0.4, float("nan")],
            "p_value": [0.1] * 4,
            "auroc": [0.7, 0.4, 0.8, 0.5],
        }
    )
    paths = [
        figures.correlation_heatmap(corr, tmp_path / "h.png"),
        figures.histogram_by_label(
            [0.0, 0.1, 0.5], ["all_fail", "mixed", "mixed"], tmp_path / "d.png", "d_K", 0.12
        ),
        figures.scatter_by_label(
            [0.0, 0.1, 0.5],
            [0.0, 0.2, 0.25],
            ["all_fail", "mixed", "mixed"],
            tmp_path / "s.png",
            "d_K",
            "var",
        ),
        figures.curves_over_K({"G=16": ([5, 10], [0.2, 0.3])}, tmp_path / "c.png", "rho"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "c.png",
        "d.png",
        "h.png",
        "s.png",
    ]  # no temp files
