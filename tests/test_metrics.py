"""The communication log: bounded in memory over a run of any length, its JSONL file opened once."""
import builtins
import json

from horovod_accordion.core.collectives import Traffic
from horovod_accordion.core.metrics import HISTORY_STEPS, CommunicationLog


def test_a_long_run_keeps_the_last_steps_and_counts_every_one(tmp_path, monkeypatch):
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    path = str(tmp_path / "log.jsonl")
    log = CommunicationLog(path)
    steps = 3 * HISTORY_STEPS
    for step in range(steps):
        log.record_step(step, Traffic(step % 7, 3 * (step % 7)), lr_factor=1.0)
    log.record_check(steps, 0, {"w": 1}, {"w": 0.1}, {"w": 2.0}, bytes_sent=5, wire_bytes_sent=15)
    stats = log.as_dict()
    assert stats["steps"] == steps
    assert stats["bytes_per_step"] == [step % 7 for step in range(steps - HISTORY_STEPS, steps)]
    assert len(stats["steps_extra"]) == HISTORY_STEPS
    assert stats["total_bytes_sent"] == sum(step % 7 for step in range(steps)) + 5
    assert stats["wire_bytes_per_step"] == [3 * (step % 7) for step in range(steps - HISTORY_STEPS, steps)]
    assert stats["total_wire_bytes_sent"] == 3 * (sum(step % 7 for step in range(steps)) + 5)
    assert opened == [path], "the file is opened once"
    # Flushed as written: a reader sees every record while the log still holds the file.
    with real_open(path) as stream:
        records = [json.loads(line) for line in stream]
    assert len(records) == steps + 1 and records[-1]["event"] == "check"
    log.close()
