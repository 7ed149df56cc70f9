"""Checkers for lab deliverables: `kinetic grade LAB PATH...`; a lab's rules live in its folder."""

from kinetic.grading.checks import CheckResult, Context, Failure, Fingerprint, Lab, Skip, Unchecked
from kinetic.grading.deliverable import Deliverable, Section, parse_deliverable

__all__ = ["CheckResult", "Context", "Deliverable", "Failure", "Fingerprint", "Lab", "Section", "Skip",
           "Unchecked", "parse_deliverable"]
