"""Delivery: events to HTTP destinations, Centrifuge's way (docs/delivery.md).

``settings.py`` holds ``[[destinations]]``; the JobDB interface is in ``base.py`` with one module per
backend beside it, opened by URL with :func:`open_jobdb`, which imports the backend lazily.
"""

from __future__ import annotations
