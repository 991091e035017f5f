"""The ground layer: small modules every other package may import, and which import none of them.

* :mod:`~ground.core.objectives` — the table of calibration objectives and the facts they carry
  (:data:`~ground.core.objectives.OBJECTIVES`), shared by ``pruning`` (which scores them) and ``server``
  (which routes to the best variant of one, by its name or a synonym).
"""
