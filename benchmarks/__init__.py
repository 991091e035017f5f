"""The benchmarks behind every figure in docs/benchmarks.md, a package that imports the library.

Run each from the repository root as a module (``python -m benchmarks.NAME --help`` lists its options), e.g.::

    .venv/bin/python -m benchmarks.bench_searches --recipe tiny --drop 2 --no-write
    .venv/bin/python -m benchmarks.study_reading docs/study-smollm2-135m --write

The modules import each other as ``benchmarks.X`` and take helpers from the library (``depthprune.testing``,
``loadtest``, ``pruning``) rather than copying them; none edits ``sys.path``. ``docs_section``,
``real_model_setup`` and ``real_model_report`` are helpers of the others, not scripts; the two shell scripts
(``demo_repeats.sh``, ``study_smollm2.sh``) run from anywhere.
"""
