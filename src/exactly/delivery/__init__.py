"""Delivery: events to HTTP destinations, Centrifuge's way (docs/delivery.md).

Two backend families as subpackages, ``jobdb/`` (the jobs and their attempts: ``open_jobdb``)
and ``archive/`` (finished jobs: ``open_archive``), beside the stages that use them:
``settings.py`` (``[[destinations]]`` and ``[delivery]``), ``route.py`` (events into jobs),
``director/`` (jobs to their destinations), ``replay.py`` (finished jobs sent again), with
their pure policy (``policy.py``, ``signing.py``) and the director's ``metrics.py``.
"""
