"""The decoder tuner against fake rate sources: it keeps what pays and ends on the best measured."""

from __future__ import annotations

import pytest

from unstall.gpu.tune import DecoderTuner, Setting

BATCH = 256


def drive(tuner: DecoderTuner, rate, batches: int = 400) -> list[Setting]:
    """Feed ``tuner`` the engine time of each batch at ``rate(setting)`` images/s, switching as
    told (the next batch runs with the new setting); the settings in order of use."""
    used = [tuner.current]
    for _ in range(batches):
        change = tuner.observe(BATCH, BATCH / rate(used[-1]))
        if change is not None:
            used.append(change)
        if tuner.done:
            break
    return used


def test_it_climbs_to_the_fastest_share_and_threads():
    """A machine like MLPerf's DGX H100: the hardware share pays, threads up to 8 pay."""

    def rate(s: Setting) -> float:
        return (
            6000 + 8000 * s.hw_decoder_load + 300 * min(s.threads, 8) - 50 * max(0, s.threads - 8)
        )

    tuner = DecoderTuner(Setting(0.5, 2), max_threads=32, window=4, settle=2, max_trials=20)
    used = drive(tuner, rate)
    assert tuner.done and tuner.kept == Setting(1.0, 8) and used[-1] == Setting(1.0, 8)
    assert tuner.rates[Setting(1.0, 8)] == pytest.approx(rate(Setting(1.0, 8)))
    summary = tuner.summary()
    assert summary["decoder_chosen"] == {"hw_decoder_load": 1.0, "threads": 8}
    assert summary["decoder_tuning"] == "done" and len(summary["decoder_rates"]) == len(tuner.rates)


def test_a_lower_share_and_more_threads_are_kept_where_the_hardware_engines_are_the_limit():
    """DALI's Hopper test: the hardware engines decode their share at 9,000/s, nvJPEG the rest
    at 700/s per thread, both at once: the best split gives nvJPEG many threads."""

    def rate(s: Setting) -> float:
        return 1 / max(s.hw_decoder_load / 9000, (1 - s.hw_decoder_load) / (700 * s.threads))

    tuner = DecoderTuner(Setting(1.0, 4), max_threads=16, window=3, settle=1, max_trials=20)
    drive(tuner, rate)
    assert tuner.kept == Setting(0.5, 16) and tuner.kept_rate == max(tuner.rates.values())
    assert tuner.kept_rate == pytest.approx(18_000) and tuner.rates[
        Setting(1.0, 4)
    ] == pytest.approx(9000)


def test_changes_within_the_noise_do_not_pay_and_it_goes_back():
    rates = {Setting(1.0, 4): 10_000}

    def rate(s: Setting) -> float:
        return rates.get(s, 10_300)  # 3 % better: under the 5 % a change must pay

    tuner = DecoderTuner(Setting(1.0, 4), max_threads=8, window=2, settle=0)
    used = drive(tuner, rate)
    assert tuner.done and tuner.kept == Setting(1.0, 4) and used[-1] == Setting(1.0, 4)
    assert tuner.trials == 4  # threads 8, share 0.9, threads 2, both (0.9, 8): once each
    assert len(used) == 6  # start, four trials, back to the start


def test_batches_fed_before_a_change_are_not_counted():
    """The ``settle`` batches after a switch ran with the old setting: never its rate."""
    tuner = DecoderTuner(Setting(1.0, 1), max_threads=2, window=1, settle=2, max_trials=1)
    assert tuner.observe(BATCH, BATCH / 100) is None  # the start's build: not counted
    assert tuner.observe(BATCH, BATCH / 100) is None
    assert tuner.observe(BATCH, BATCH / 1000) == Setting(1.0, 2)  # start measured: try 2 threads
    assert tuner.observe(BATCH, BATCH / 1000) is None  # fed before the switch
    assert tuner.observe(BATCH, BATCH / 1000) is None
    assert tuner.observe(BATCH, BATCH / 2000) is None  # 2 threads: 2x, kept; no trials left
    assert tuner.done and tuner.kept == Setting(1.0, 2) and tuner.rates[Setting(1.0, 2)] == 2000


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="window=0"):
        DecoderTuner(Setting(1.0, 4), max_threads=8, window=0)


def test_the_start_is_measured_after_its_pipelines_build():
    """The first batches pay DALI's build: not the start setting's rate (on an H200 the first
    window read 778/s at 4 threads, the same setting alone ~28,800/s, so 8 threads "paid")."""
    steady = {Setting(1.0, 4): 10_000.0, Setting(1.0, 8): 10_100.0}  # within the noise
    tuner = DecoderTuner(Setting(1.0, 4), max_threads=8, window=4, settle=2, max_trials=4)
    building = [500.0, 500.0]  # the first two batches, while the pipeline builds
    used = [tuner.current]
    for _ in range(100):
        rate = building.pop() if building else steady.get(used[-1], 9_000.0)
        change = tuner.observe(BATCH, BATCH / rate)
        if change is not None:
            used.append(change)
        if tuner.done:
            break
    assert tuner.done and tuner.rates[Setting(1.0, 4)] == pytest.approx(10_000.0)
    assert tuner.kept == Setting(1.0, 4) and used[-1] == Setting(1.0, 4)
