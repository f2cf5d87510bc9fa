"""gradkern's error types. Every message names the op, the argument, what was expected and what was given."""

from __future__ import annotations

from typing import Any

__all__ = ["GradkernError", "InvalidProblem", "Unsupported"]


class GradkernError(Exception):
    """Base class of every error gradkern raises on purpose."""

    def __init__(self, op: str, arg: str, expected: str, given: Any):
        self.op, self.arg, self.expected, self.given = op, arg, expected, given
        super().__init__(f"{op}: argument '{arg}': expected {expected}, but got {given}")


class InvalidProblem(GradkernError, ValueError):
    """The problem is ill-posed: shapes, axes, paddings or scalar values that cannot be right."""


class Unsupported(GradkernError, TypeError, NotImplementedError):
    """A well-posed problem gradkern does not handle: dtype, rank or device not wired."""
