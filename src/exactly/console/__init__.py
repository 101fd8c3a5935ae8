"""The web console ``exactly up`` serves: the pipeline's state as a page and as JSON."""
