"""`bench launch` end to end on a tiny run (its figures are the bench's, not asserted here)."""

from __future__ import annotations

from unstall.bench import load


def test_bench_launch_reports_the_three_cases():
    bench = load("launch")
    # no fresh cache to compile torch into, no warm-up runs: the figures are not asserted
    script_args = ("--epochs", "1", "--samples", "128")
    result = bench.run(quick=True, repeats=1, script_args=script_args, fresh_cache=False)
    cases = [r["case"] for r in result.rows]
    assert cases == [
        "python examples/train_min.py",
        "a tiny loader script (the fixed cost)",
        "true (the launcher alone)",
        "python -c 'import torch' (start-up hook)",
    ]
    for r in result.rows:
        assert r["plain_ms"] > 0 and r["unstall_ms"] > 0 and r["ratio"] > 0
    assert result.rows[0]["unstall_cpu_ms"] > 0  # the script and its workers ran
    assert abs(result.ratio - result.rows[0]["ratio"]) < 1e-3  # the headline is train_min's
