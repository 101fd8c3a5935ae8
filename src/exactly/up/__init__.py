"""``exactly up``: the pipeline as one service (issue 14).

``supervisor.py`` runs the parts as child processes and restarts them; ``pipeline.py`` is the Spark
part (every query in one application); ``watch.py`` reads where each stage stands from the
outside; ``view.py`` shows it in the terminal.
"""
