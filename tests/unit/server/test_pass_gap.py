"""Poked scheduler passes start MIN_PASS_GAP_S after the last one ended, so a burst of pokes folds into
a few passes (server/live/loops.py)."""

from __future__ import annotations

from mwms.server.live.loops import MIN_PASS_GAP_S, pause_before_pass


def test_a_pass_right_after_another_waits_out_the_gap_and_one_after_it_does_not():
    assert pause_before_pass(last_end=10.0, now=10.0) == MIN_PASS_GAP_S
    assert 0 < pause_before_pass(last_end=10.0, now=10.0 + MIN_PASS_GAP_S / 2) < MIN_PASS_GAP_S
    assert pause_before_pass(last_end=10.0, now=10.0 + MIN_PASS_GAP_S + 1e-6) == 0.0
    assert pause_before_pass(last_end=0.0, now=1000.0) == 0.0  # the first pass, or after a quiet spell
    assert pause_before_pass(last_end=20.0, now=10.0) == MIN_PASS_GAP_S  # never more than the gap
