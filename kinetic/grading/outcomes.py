"""How a check ends other than by passing: the exceptions a lab's check raises, and the ledger and
live-server views raise for it (kept apart from the check model so those views need not import it)."""

from __future__ import annotations


class Failure(Exception):
    """The deliverable does not meet the check: `rationale` says what, `help` what to do."""

    def __init__(self, rationale: str, help: str = ""):
        super().__init__(rationale)
        self.rationale = rationale
        self.help = help


class Skip(Exception):
    """The check cannot be judged: an output it needs is missing (and fails its own check)."""


class Unchecked(Exception):
    """The check could not run: the server failed or timed out, or the outputs come from another model."""
