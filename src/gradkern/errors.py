"""gradkern's error types. Every message names the op, the argument, what was expected and what was given."""

from __future__ import annotations

from typing import Any

__all__ = ["GradkernError", "InvalidProblem", "Unsupported", "RankUnsupported"]


class GradkernError(Exception):
    """Base class of every error gradkern raises on purpose."""

    def __init__(self, op: str, arg: str, expected: str, given: Any):
        self.op, self.arg, self.expected, self.given = op, arg, expected, given
        super().__init__(f"{op}: argument '{arg}': expected {expected}, but got {given}")


class InvalidProblem(GradkernError, ValueError, RuntimeError):
    """The problem is ill-posed: shapes, axes, paddings or scalar values that cannot be right. Also a
    RuntimeError, which is what stock PyTorch raises for these (so `except RuntimeError` catches both)."""


class Unsupported(GradkernError, TypeError, NotImplementedError):
    """A well-posed problem gradkern does not handle: dtype, rank or device not wired."""


class RankUnsupported(Unsupported):
    """A problem of more dims (after merging neighbours) than the kernels index: well-posed, and stock PyTorch takes
    it, so under enable() a routed call that meets it runs stock instead."""
