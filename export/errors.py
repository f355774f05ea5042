"""The one error type export raises: a message a user can act on, printed as one line."""

from __future__ import annotations


class ExportError(RuntimeError):
    """Export failed for a reason the user can fix (bad SRC, unsupported model, bad flag)."""
