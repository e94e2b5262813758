"""`runtime.checkpoint`: the suggested checkpoint interval from measured write time and failures."""

from __future__ import annotations

from runtime.checkpoint import suggest


def test_suggestion_uses_elapsed_as_mtbf_bound_without_failures() -> None:
    s = suggest(write_s=2.0, failures=0, elapsed_s=800.0, step_s=0.5)
    assert s.mtbf_is_lower_bound and s.mtbf_s == 800.0
    assert s.interval_steps == round(s.interval_s / 0.5)
    assert ">=" in s.line()
    assert not suggest(2.0, 4, 800.0, 0.5).mtbf_is_lower_bound
