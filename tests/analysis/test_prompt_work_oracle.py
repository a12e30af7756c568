"""prompt_work against its original (fixtures/reference/prompt_work.py) on random traces."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from fixtures.reference import prompt_work as reference
from fixtures.reference.traces import random_trace

from retrybench.analysis.prompt_work import prompt_work


@pytest.mark.parametrize("seed", range(20))
def test_random_traces_match_the_reference(seed: int) -> None:
    events = random_trace(seed)
    events += [{"t": 1.0, "event": "first_token", "execution": 3}, {"t": 2.0, "event": "first_token", "execution": 4}]
    for window in (None, (1.0, 4.0)):
        assert asdict(prompt_work(events, last_window=window)) == asdict(
            reference.prompt_work(events, last_window=window))
