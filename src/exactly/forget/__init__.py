"""Forgetting a person (``exactly forget``): regulations, suppression, deletion per store.

* :mod:`.regulations`: the key, the keyed hashes, the regulations topic folded;
* :mod:`.stub`: what a forgotten event becomes in a log topic (counted, never landed or sent);
* :mod:`.found`: what a forget finds of a person in the log first (message ids, texts);
* :mod:`.apply`: a regulation applied store by store by the command;
* :mod:`.follow`, :mod:`.lake`: a running part (the lake query) applying its store;
* :mod:`.readers`: what the lake, the route and backfill skip (stubs, forgotten ids);
* :mod:`.files`: the logs under the data dir overwritten in place.

docs/forget.md has the design: where a person is kept, the order of operations, and who
applies a regulation to each store.
"""
