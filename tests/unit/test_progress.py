"""srollout.progress.StageBar: the columns a stage asks for, and nothing when disabled."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console

from srollout.progress import StageBar


def test_disabled_bar_is_silent_and_has_no_rich_progress():
    bar = StageBar(None, "collect", 10, enabled=False)
    with bar:
        bar.update(advance=3, info="x")
    assert not hasattr(bar, "bar") and bar.total == 10


def test_enabled_bar_renders_label_unit_fields_and_counts():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    bar = StageBar(
        console,
        "ab-rollout",
        8,
        enabled=True,
        completed=2,
        before=("run",),
        unit="groups",
        after=("rate",),
    )
    with bar:
        bar.update(advance=3, run="gated r0 b1", rate="650 tok/s")
    text = out.getvalue()
    assert (
        "ab-rollout" in text
        and "gated r0 b1" in text
        and "5/8" in text
        and "groups" in text
        and "650 tok/s" in text
    )
    assert "ETA" in text
    seeds = StageBar(Console(file=io.StringIO(), width=200), "seeds", 4, enabled=True, eta=False)
    assert not any(type(c).__name__ == "TimeRemainingColumn" for c in seeds.bar.columns)


def test_off_a_terminal_the_bar_prints_plain_lines_at_most_every_interval(monkeypatch):
    import srollout.progress as progress

    clock = iter([0.0, 10.0, 20.0, 45.0, 60.0, 100.0])  # t0, then one reading per update
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    bar = StageBar(console, "collect", 4, enabled=True, unit="groups", after=("rate",))
    bar.update(advance=1, rate="700 tok/s")  # t=10: the first line
    bar.update(advance=1)  # t=20: within 30 s of the last line, silent
    bar.update(rate="650 tok/s")  # t=45: 35 s later, a line
    bar.update(advance=1)  # t=60: silent
    bar.update(advance=1)  # t=100: finished, a line
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("collect:")]
    assert lines == [
        "collect: 1/4 groups 700 tok/s, elapsed 0:10, ETA 0:30",  # 10 s per group, 3 to go
        "collect: 2/4 groups 650 tok/s, elapsed 0:45, ETA 0:45",
        "collect: 4/4 groups 650 tok/s, elapsed 1:40",
    ]


def test_on_a_terminal_the_bar_prints_no_plain_lines():
    out = io.StringIO()
    bar = StageBar(Console(file=out, force_terminal=True, width=200), "collect", 2, enabled=True)
    bar.update(advance=2)
    assert not bar.plain_lines and "collect: 2/2" not in out.getvalue()


def test_the_closing_line_is_printed_once():
    out = io.StringIO()
    bar = StageBar(
        Console(file=out, force_terminal=False, width=200),
        "collect",
        2,
        enabled=True,
        after=("rate",),
    )
    bar.update(advance=2)
    bar.update(rate="700 tok/s")  # a field update after the work is done: no second closing line
    assert sum(ln.startswith("collect: 2/2") for ln in out.getvalue().splitlines()) == 1


def test_phase_bars_show_each_phase_in_turn_with_its_unit_and_info():
    from srollout.progress import PhaseBars

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with PhaseBars(
        console, enabled=True, unit={"generating games": "games", "SFT": "steps"}
    ) as bars:
        games, sft = bars.phase("generating games"), bars.phase("SFT")
        for k in range(1, 4):
            games(k, 3)
        assert bars.open is None  # 3/3 closed it
        sft(1, 10, "loss 2.500")  # opens the next phase
        assert bars.name == "SFT"
    assert bars.open is None  # leaving closes an unfinished phase
    text = out.getvalue()
    # off a terminal: the first update and the closing one print a plain line each
    assert "generating games: 3/3 games" in text
    assert "SFT: 1/10 steps loss 2.500" in text
    assert text.index("generating games: 3/3") < text.index("SFT: 1/10")


def test_disabled_phase_bars_print_nothing():
    from srollout.progress import PhaseBars

    out = io.StringIO()
    with PhaseBars(Console(file=out, force_terminal=False), enabled=False) as bars:
        bars.phase("SFT")(5, 5, "loss 1")
    assert out.getvalue() == ""


def test_the_collect_bar_and_summary_name_which_throughput_each_shows(monkeypatch):
    """The bar's tok/s is tokens over wall-clock, the summary's first throughput row; the second
    row is tokens over time inside generate. 1,200 tokens in 2 s of wall-clock of which 1.5 s
    generating: 600 tok/s on both, 800 tok/s generation speed."""
    import srollout.progress as progress
    from srollout.rollout.engine import TickStats
    from srollout.stages.collect import CollectStats, stats_frame

    clock = itertools.chain([0.0], itertools.repeat(2.0))  # the bar starts at 0, then 2 s pass
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    bar = progress.RolloutBar(Console(file=out, force_terminal=False, width=200), "collect", 1,
                              enabled=True)  # fmt: skip
    bar.tick(TickStats(1, 8, 1200, 1.5, 0.3, 0, 1))
    bar.advance(1)
    assert "600 tok/s since the start, 8 in flight" in out.getvalue()
    stats = CollectStats(
        n_groups=1, label_counts={}, zero_var_rate=0.0, success_rate=0.0, valid_rate=1.0,
        n_cut=0, n_stalled=0, n_steps=8, n_gen_tokens=1200, wall_s=2.0, tok_per_s=1200 / 2.0,
        gen_tok_per_s=1200 / 1.5, resumed_groups=0,
    )  # fmt: skip
    rows = dict(stats_frame(stats).iter_rows())
    assert rows["throughput (generated tokens ÷ rollout wall-clock)"] == "600 tok/s"
    assert rows["generation speed (tokens ÷ time inside generate)"] == "800 tok/s"
    none = stats._replace(n_gen_tokens=0, tok_per_s=float("nan"), gen_tok_per_s=float("nan"))
    speed = dict(stats_frame(none).iter_rows())["generation speed (tokens ÷ time inside generate)"]
    assert speed == "—"
    # four Ray workers: 1.5 s inside generate is summed over them, so the speed is one worker's
    four = dict(stats_frame(stats._replace(workers=4)).iter_rows())
    name = (
        "generation speed of one worker (tokens ÷ time inside generate, summed over the 4 workers)"
    )
    assert (
        four[name] == "800 tok/s" and "generation speed (tokens ÷ time inside generate)" not in four
    )


def test_a_resumed_run_counts_and_times_only_its_own_work(monkeypatch):
    import srollout.progress as progress

    clock = iter([0.0, 0.0, 40.0])  # t0, the resume's line, one step 40 s in
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    bar = StageBar(
        Console(file=out, force_terminal=False, width=200), "train-onpolicy", 80, enabled=True
    )
    bar.resumed(0)  # nothing finished before: no change, no line
    bar.resumed(62)  # two arms' checkpoints at 31 of 40
    bar.update(advance=1)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("train-onpolicy:")]
    # 18 left of this run: one took 40 s, so 17 more take 680 s (not 17 x 40 / 63 s)
    assert lines == [
        "train-onpolicy: 0/18, elapsed 0:00",
        "train-onpolicy: 1/18, elapsed 0:40, ETA 11:20",
    ]


def test_the_rollout_bars_eta_counts_neither_start_up_nor_the_first_wave_as_the_pace(monkeypatch):
    """100 groups, 8 in flight. The model loads for 50 s (no tick yet: no ETA); the policy's
    first call comes at 50 s; the first group ends at 60 s with 7 still in flight. The pace since
    the first tick: 10 s for 1 + 7/2 = 4.5 groups' worth, 95.5 to go: 212 s (3:32). The old
    estimate, 60 s a group done, said 99 minutes."""
    import srollout.progress as progress
    from srollout.rollout.engine import TickStats

    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    bar = progress.RolloutBar(console, "collect", 100, enabled=True)
    assert bar._remaining(0, 100, 40.0) is None  # loading: nothing to go by
    now[0] = 50.0
    bar.tick(TickStats(1, 64, 640, 1.0, 0.1, 8, 0))
    now[0] = 60.0
    bar.tick(TickStats(2, 64, 640, 1.0, 0.1, 7, 1))
    bar.advance(1)
    assert bar._remaining(1, 100, 60.0) == pytest.approx(10 * 95.5 / 4.5)
    assert bar.bar.tasks[0].fields["eta"] == "ETA 3:32"
    # off a terminal the line at the first tick says no ETA (no group done yet)
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("collect:")]
    assert lines == ["collect: 0/100 groups 13 tok/s since the start, 64 in flight, elapsed 0:50"]
    now[0] = 95.0
    bar.advance(1)  # 35 s after the last line: a line, its ETA once
    line = out.getvalue().splitlines()[-1]
    assert line.endswith(f"elapsed 1:35, ETA {progress._clock(45 * 94.5 / 5.5)}")
    assert line.count("ETA") == 1
    bar.advance(98)
    assert bar.bar.tasks[0].fields["eta"] == ""  # done: no ETA
