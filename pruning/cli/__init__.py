"""The pruning side's commands, mounted by the console script (:mod:`depthprune.cli.app`).

* :mod:`.commands` — ``prune``, ``checkpoint``, ``eval``, ``heal``, ``study`` (typed functions are the CLI);
* :mod:`.groups` — option groups shared by ``prune`` and ``study``;
* :mod:`.options` — the options' help texts and choices;
* :mod:`.data` — ``depthprune data show``;
* :mod:`.bench` — ``depthprune bench-evaluator``, the subset scorer against naive forwards.

The top layer of :mod:`pruning`: it imports every sub-package, and none imports it.
"""
