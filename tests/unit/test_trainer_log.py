"""The trainer log's refusals (srollout.rollout.trainer_log): each one line, before anything
is written. Writing, resuming and merging are tested with a real GRPOTrainer killed mid-run
(tests/component/test_trl_integration.py)."""

from __future__ import annotations

import json

import pytest

from srollout.errors import SrolloutError
from srollout.rollout.trainer_log import TrainerLog, merge_log


def test_a_log_of_other_settings_or_of_another_kind_is_refused(tmp_path):
    log = tmp_path / "log"
    assert TrainerLog(log, {"G": 4, "seed": 0}).open(0).steps == ()
    assert json.loads((log / "manifest.json").read_text())["stage"] == "trainer-log"
    with pytest.raises(SrolloutError, match="belongs to a run made with G=4, not 8"):
        TrainerLog(log, {"G": 8, "seed": 0}).open(0)
    TrainerLog(log, {"G": 4, "seed": 0}).open(0)  # the same settings, nothing logged yet: fine
    other = tmp_path / "collect"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"stage": "collect", "config": {}}))
    with pytest.raises(SrolloutError, match="is a 'collect' run, not a trainer log"):
        TrainerLog(other, {"G": 4}).open(0)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(SrolloutError, match="has no manifest.json: it is not a srollout"):
        TrainerLog(stray, {"G": 4}).open(0)
    assert sorted(p.name for p in stray.iterdir()) == ["notes.txt"]  # nothing written
    with pytest.raises(SrolloutError, match="holds no trainer-log parts"):
        merge_log(log)
    with pytest.raises(SrolloutError, match="before open"):
        TrainerLog(tmp_path / "new", {"G": 4}).write(1, [], [])
