"""The schedule (``horovod_accordion.accordion.Accordion``) alone: no framework, no processes."""
import warnings

import pytest

from horovod_accordion.accordion import NO_WINDOW_WARNING_STEPS, Accordion


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
