"""Checkers for lab deliverables: `kinetic grade LAB PATH...`."""

from kinetic.grading.checks import CheckResult, Checklist, Failure, Skip
from kinetic.grading.deliverable import Deliverable, Section, parse_deliverable

__all__ = ["CheckResult", "Checklist", "Deliverable", "Failure", "Section", "Skip", "parse_deliverable"]
