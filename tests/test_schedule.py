"""The schedule (``horovod_accordion.core.schedule.Accordion``) alone: no framework, no processes."""
import math
import warnings

import pytest

from horovod_accordion.core.schedule import NO_WINDOW_WARNING_STEPS, Accordion


def test_a_run_that_never_closes_a_window_is_told_after_longer_than_an_epoch():
    """It used to be told only at exit, after the whole run had stayed at ℓ_low."""
    schedule = Accordion(["w"], (2, 1))
    for _ in range(NO_WINDOW_WARNING_STEPS - 1):
        schedule.step_done()
    with pytest.warns(RuntimeWarning, match=r"never closed a detection window.*end_epoch\(\)"):
        schedule.step_done()


@pytest.mark.parametrize("options, windows", [({"window_steps": None}, 1), ({"window_steps": 10}, 0)])
def test_no_such_warning_where_windows_close_or_close_themselves(options, windows):
    schedule = Accordion(["w"], (2, 1), **options)
    for _ in range(windows):
        schedule.end_window([1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(NO_WINDOW_WARNING_STEPS):
            schedule.step_done()


def test_a_fixed_level_needs_no_windows():
    schedule = Accordion(["w"], (2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(NO_WINDOW_WARNING_STEPS):
            schedule.step_done()


@pytest.mark.parametrize("lr_decay_factor", [2.0, None])
def test_each_check_logs_its_windows_rate_with_or_without_the_decay_rule(lr_decay_factor):
    """Without the decay rule the checks logged lr=None, so a plot of the run had no schedule."""
    schedule = Accordion(["w"], (2, 1), interval=1, lr_decay_factor=lr_decay_factor)
    for lr in (0.1, 0.1, 0.01):
        schedule.observe_lr(lr)
        schedule.end_window([1.0])
    assert [record["lr"] for record in schedule.log.checks if record["event"] == "check"] == [0.1, 0.1, 0.01]


@pytest.mark.parametrize("levels", [(2, 2), (None, None)])
def test_a_fixed_level_logs_no_decay_events(levels):
    """A static or uncompressed run logged an ``lr_decay`` once a smooth schedule fell to half its
    peak (the transformer study's cosine, at step 350 of 600), which an adaptive run on the same
    schedule never sees: its windows did not pass, so the rule compared with the run's peak."""
    schedule = Accordion(["w"], levels)
    adaptive = Accordion(["w"], (2, 1), interval=1)
    for window in range(30):
        for step in range(20):
            lr = 0.1 + 0.9 * (1 + math.cos(math.pi * (window * 20 + step) / 600)) / 2
            schedule.observe_lr(lr)
            adaptive.observe_lr(lr)
        schedule.end_window()
        adaptive.end_window([1.0])
    assert [r for r in adaptive.log.checks if r["event"] == "lr_decay"] == []
    assert [r for r in schedule.log.checks if r["event"] == "lr_decay"] == []
