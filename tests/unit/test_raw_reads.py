"""Objects are read typed past the edge: raw reads of metadata/spec/status in reconcile/ and gateway/ (counted by
tests/rawreads.py) are at most a fifth of what they were before issue 29."""

from __future__ import annotations

from tests.rawreads import BASELINE, counts

CEILING = BASELINE // 5  # 80 % fewer: 47 of 237


def test_raw_reads_in_reconcile_and_gateway_are_down_by_80_percent() -> None:
    found = counts()
    total = sum(found.values())
    most = "\n".join(f"{reads:5}  {name}" for name, reads in found.most_common(10))
    assert total <= CEILING, (f"{total} raw reads of metadata/spec/status (at most {CEILING}, a fifth of {BASELINE}); "
                              f"most in:\n{most}\n(python tests/rawreads.py lists them all)")
