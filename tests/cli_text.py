"""What the CLI said, whatever its lines: a message wrapped to 80 columns (exactly.text.message)
read back as the one line it was written as."""

from __future__ import annotations


def said(text: str) -> str:
    """``text`` with its line breaks and their indentation as single spaces."""
    return " ".join(text.split())


def messages(text: str) -> list[str]:
    """Each message in ``text`` as the one line it was written as: a line indented by two spaces
    goes on the message above it (:func:`exactly.text.message` indents the lines it breaks)."""
    found: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and found:
            found[-1] += " " + line.strip()
        elif line.strip():
            found.append(line)
    return found
