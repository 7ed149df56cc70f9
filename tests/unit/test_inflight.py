"""Requests in flight per key: one model's count and the router's, together (kinetic/scheduling/inflight.py)."""

from __future__ import annotations

import pytest

from kinetic.errors import RateLimitError
from kinetic.scheduling.inflight import InFlight, ModelInFlight


def test_a_models_count_and_the_routers_count_together_all_or_none() -> None:
    """ModelInFlight counts a request in the model's limit and the process-wide one, or in neither: a list
    that would pass either limit is refused whole and leaves both counts as they were."""

    shared = InFlight(3)
    model = ModelInFlight(2, shared)
    model.enter({"ann": 1})
    with pytest.raises(RateLimitError, match="at most 2"):
        model.enter({"ann": 2})  # the model's own limit
    shared.enter("bob", 3)
    with pytest.raises(RateLimitError, match=r"across all models \(at most 3\)"):
        model.enter({"ann": 1, "bob": 1})  # ann fits, bob is over the router's: neither is counted
    assert model.own.counts() == {"ann": 1} and shared.counts() == {"ann": 1, "bob": 3}
    model.leave("ann")
    assert model.own.counts() == {} and shared.counts() == {"bob": 3}
