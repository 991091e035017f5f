"""The ground every depthprune package stands on, and which imports none of them.

* :mod:`~ground.core` — small helpers with no torch: the calibration objectives' facts, errors, settings,
  checksums, the atomic writer, the process-group stopper, the option and registry shapes, the version;
* :mod:`~ground.planning` — memory plans from a model's config.json, before any weight loads;
* :mod:`~ground.demo` — the demo's assets: its recipe, data layout, generated corpus and model.

The shell that uses every package (the command line :mod:`depthprune.cli`, the testing kit
:mod:`depthprune.testing`) lives in the ``depthprune`` folder; imports run one way, from the shell down to
here.
"""
