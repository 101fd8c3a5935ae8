"""``python -m exactly`` runs the CLI."""

from exactly.cli import main

main()
