"""The detector on recorded norm sequences: no framework, no processes."""
import math
import warnings

import pytest

from horovod_accordion.core.detector import RegimeDetector


def cifar_lr(epoch, workers=4):
    """The authors' CIFAR schedule (spec §2.2, §6): warm-up over 5 epochs, ÷10 at 152, ÷100 at 252."""
    base = 0.1 * (1 + (workers - 1) * min(epoch / 5, 1))
    if epoch >= 252:
        return base / 100
    if epoch >= 152:
        return base / 10
    return base


def cifar_norm(epoch):
    """An accumulated-gradient norm shaped like Fig. 2a: a fast fall, a plateau, a drop at each decay."""
    if epoch >= 252:
        return 0.1
    if epoch >= 152:
        return 0.3
    return 1 + 10 * math.exp(-epoch / 4)


def run_schedule(detector, epochs, lr, norm):
    """The level in force during each epoch: True = critical (ℓ_low)."""
    levels = []
    for epoch in range(epochs):
        detector.observe_lr(lr(epoch))
        levels.append(list(detector.critical))
        detector.end_window([norm(epoch)] * detector.num_layers)
    return levels


def low_epochs(levels, layer=0):
    return {e for e, flags in enumerate(levels) if flags[layer]}


def test_cifar_schedule_low_early_and_after_each_decay():
    levels = run_schedule(RegimeDetector(num_layers=3), 300, cifar_lr, cifar_norm)
    expected = set(range(0, 21)) | set(range(152, 171)) | set(range(252, 271))
    for layer in range(3):
        assert low_epochs(levels, layer) == expected


def test_first_check_forces_low_and_zero_old_norm_is_critical():
    detector = RegimeDetector(num_layers=2, interval=1)
    assert detector.critical == [True, True]
    detector.end_window([0.0, 5.0])
    assert detector.critical == [True, True]
    detector.end_window([1.0, 5.0])  # layer 0: old norm 0 -> critical; layer 1: no change
    assert detector.critical == [True, False]


def test_threshold_is_inclusive_and_counts_increases():
    detector = RegimeDetector(num_layers=3, interval=1, eta=0.5)
    detector.end_window([2.0, 2.0, 2.0])
    detector.end_window([1.0, 3.0, 1.1])  # ratios 0.5, 0.5, 0.45
    assert detector.critical == [True, True, False]
    assert detector.last_ratios == pytest.approx([0.5, 0.5, 0.45])


def test_checks_only_every_interval_and_compare_with_window_minus_interval():
    detector = RegimeDetector(num_layers=1, interval=3)
    checks = [detector.end_window([n]) for n in [10.0, 1.0, 1.0, 9.0, 1.0, 1.0, 9.0]]
    assert checks == [True, False, False, True, False, False, True]
    # window 3 vs window 0: 9 vs 10 -> 0.1 -> high; window 6 vs 3: 9 vs 9 -> high
    assert detector.critical == [False]


def test_layers_decide_independently_and_whole_model_mode_decides_once():
    per_layer = RegimeDetector(num_layers=2, interval=1)
    whole = RegimeDetector(num_layers=2, interval=1, per_layer=False)
    for detector in (per_layer, whole):
        detector.end_window([10.0, 1.0])
        detector.end_window([10.0, 3.0])
    assert per_layer.critical == [False, True]
    # global norm sqrt(101) -> sqrt(109): a 4 % change, below eta
    assert whole.critical == [False, False]


def test_non_finite_norm_keeps_level_and_warns():
    detector = RegimeDetector(num_layers=2, interval=1)
    detector.end_window([4.0, 4.0])
    detector.end_window([4.0, 4.0])
    assert detector.critical == [False, False]
    with pytest.warns(RuntimeWarning, match="non-finite"):
        detector.end_window([float("nan"), 40.0])
    assert detector.critical == [False, True]
    # the NaN did not replace layer 0's reference norm
    assert detector.last_check_norms[0] == 4.0
    detector.end_window([4.1, 40.0])
    assert detector.critical == [False, False]


def test_step_decay_fires_once_per_drop_and_warmup_never_fires():
    detector = RegimeDetector(num_layers=1)
    events = []
    for epoch in range(300):
        if detector.observe_lr(cifar_lr(epoch)):
            events.append(epoch)
        detector.end_window([1.0])
    assert events == [152, 252]


def cosine(epoch, epochs=300):
    return 0.05 * (1 + math.cos(math.pi * epoch / epochs))


def test_cosine_schedule_is_left_to_the_norm_rule():
    """A drop counted from the last event fired 12 times on this schedule and kept ℓ_low for
    31 of the last 50 epochs; a drop must now happen within one window."""
    detector = RegimeDetector(num_layers=1, interval=10)
    events, levels = [], []
    for epoch in range(300):  # to the last epoch, where the rate falls fastest in relative terms
        if detector.observe_lr(cosine(epoch)):
            events.append(epoch)
        levels.append(detector.critical[0])
        detector.end_window([1.0])
    assert len(events) <= 2 and all(e >= 295 for e in events), events
    assert not any(levels[21:295])  # after the first checks, ℓ_high to the end


def test_cosine_observed_every_step_fires_only_in_its_last_epochs():
    """The torch optimizer observes the rate at every step: a per-step cosine must not pin ℓ_low either."""
    detector = RegimeDetector(num_layers=1, interval=10)
    events = []
    for epoch in range(300):
        for step in range(50):
            if detector.observe_lr(cosine(epoch + step / 50)):
                events.append(epoch)
        detector.end_window([1.0])
    assert events and min(events) >= 294, events


def test_step_decay_observed_every_step_fires_once_per_drop():
    detector = RegimeDetector(num_layers=1)
    events = []
    for epoch in range(300):
        for step in range(20):
            if detector.observe_lr(cifar_lr(epoch)):
                events.append((epoch, step))
        detector.end_window([1.0])
    assert events == [(152, 0), (252, 0)]


def test_two_halvings_in_consecutive_windows_fire_twice():
    detector = RegimeDetector(num_layers=1)
    fired = []
    for lr in [1.0, 1.0, 0.5, 0.25, 0.25]:
        fired.append(detector.observe_lr(lr))
        detector.end_window([1.0])
    assert fired == [False, False, True, True, False]


def test_fast_anneal_fires_at_most_once_per_window():
    """OneCycleLR's anneal halves the rate several times within one epoch: one event per window."""
    detector = RegimeDetector(num_layers=1, interval=1)
    events = []
    for epoch in range(3):
        for step in range(100):
            if detector.observe_lr(1.0 * 0.5 ** ((epoch * 100 + step) / 12)):  # ÷2 every 12 steps
                events.append((epoch, step))
        detector.end_window([1.0])
    assert [epoch for epoch, _ in events] == [0, 1, 2], events


def test_decay_flag_survives_a_state_dict_round_trip():
    detector = RegimeDetector(num_layers=1)
    assert detector.observe_lr(1.0) is False and detector.observe_lr(0.4) is True
    restored = RegimeDetector(num_layers=1)
    restored.load_state_dict(detector.state_dict())
    assert restored.observe_lr(0.1) is False  # a second drop in the same window


def test_a_state_of_another_configuration_warns_naming_what_differs_and_which_wins():
    saved = RegimeDetector(num_layers=2, eta=0.5, interval=10).state_dict()
    detector = RegimeDetector(num_layers=2, eta=0.3, interval=5)
    with pytest.warns(RuntimeWarning, match=r"eta=0\.5 \(constructed with 0\.3\), interval=10 \(constructed "
                                            r"with 5\): the checkpoint's values win"):
        detector.load_state_dict(saved)
    assert detector.eta == 0.5 and detector.interval == 10


def test_slow_decay_across_windows_never_fires():
    """×0.8 per window: a factor 2 over four windows, but never within one."""
    detector = RegimeDetector(num_layers=1)
    fired = []
    for window in range(60):
        fired.append(detector.observe_lr(0.8 ** window))
        detector.end_window([1.0])
    assert not any(fired)


def test_linear_warmup_then_linear_decay():
    def warmup_linear(step):
        return 0.4 * step / 10 if step < 10 else 0.4 * (1 - (step - 10) / 100)

    detector = RegimeDetector(num_layers=1, lr_decay_factor=4.0)
    events = [s for s in range(110) if detector.observe_lr(warmup_linear(s))]
    # 0.4 -> 0.1 at step 85, then 0.1 -> 0.024 at 104 and 0.024 -> 0.004 at 109, a factor 4 each
    # time; all in one window, which has at most one decay event
    assert events == [85]
    detector.end_window([1.0])
    assert detector.observe_lr(0.001) is True  # the next window's drop fires


def test_decay_rule_holds_until_next_check_which_decides_again():
    detector = RegimeDetector(num_layers=1, interval=2)
    for n in [1.0, 1.0, 1.0]:
        detector.end_window([n])
    assert detector.critical == [False]
    assert detector.observe_lr(1.0) is False
    assert detector.observe_lr(0.1) is True
    assert detector.critical == [True]
    detector.end_window([1.0])  # window 3: no check
    assert detector.critical == [True]
    detector.end_window([1.0])  # window 4 vs 2: no change -> ℓ_high again
    assert detector.critical == [False]


def test_state_dict_round_trip_continues_identically():
    original = RegimeDetector(num_layers=2, interval=2)
    run_schedule(original, 13, cifar_lr, cifar_norm)
    clone = RegimeDetector(num_layers=2)
    clone.load_state_dict(original.state_dict())
    assert clone.state_dict() == original.state_dict()
    for epoch in range(13, 40):
        for detector in (original, clone):
            detector.observe_lr(cifar_lr(epoch))
            detector.end_window([cifar_norm(epoch), 2 * cifar_norm(epoch)])
        assert clone.critical == original.critical


@pytest.mark.parametrize("kwargs, message", [
    ({"num_layers": 0}, "num_layers"),
    ({"num_layers": 1, "eta": 0}, "eta"),
    ({"num_layers": 1, "eta": float("inf")}, "eta"),
    ({"num_layers": 1, "interval": 0}, "interval"),
    ({"num_layers": 1, "lr_decay_factor": 1.0}, "lr_decay_factor"),
])
def test_bad_configuration_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RegimeDetector(**kwargs)


def test_wrong_number_of_norms_raises():
    with pytest.raises(ValueError, match="expected 2 norms"):
        RegimeDetector(num_layers=2).end_window([1.0])
    with pytest.raises(ValueError, match="is a check"):
        RegimeDetector(num_layers=2).end_window()


def test_windows_between_checks_need_no_norms():
    detector = RegimeDetector(num_layers=1, interval=3)
    assert detector.next_window_is_check
    detector.end_window([1.0])
    assert not detector.next_window_is_check
    assert detector.end_window() is False and detector.end_window() is False
    assert detector.next_window_is_check


def test_detector_imports_no_framework():
    import subprocess
    import sys
    code = ("import sys, horovod_accordion.core.detector; "
            "bad = [m for m in ('torch', 'tensorflow', 'horovod') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True)
