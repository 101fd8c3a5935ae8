"""Forgetting a person (``exactly forget``): regulations, suppression, deletion per store.

* :mod:`.regulations`: the key, the keyed hashes, the regulations topic folded;
* :mod:`.stub`: what a forgotten event becomes in a log topic (counted, never landed or sent).

docs/forget.md has the design: where a person is kept, the order of operations, and who
applies a regulation to each store.
"""
