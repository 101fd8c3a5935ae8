"""What the CLI said, whatever its lines: a message wrapped to 80 columns (exactly.text.message)
read back as the one line it was written as."""

from __future__ import annotations


def said(text: str) -> str:
    """``text`` with its line breaks and their indentation as single spaces."""
    return " ".join(text.split())
