"""The benchmarks: each module is a script that measures something and writes results/NAME.json, run either way:

    python -m benchmarks.NAME [options]      # from the repository root
    python benchmarks/NAME.py [options]      # the form README and the result files record

`common.py` holds what the scripts share, `experiments.py` what the experiments share, and `analysis.py` every name
a lesson reads from the benchmarks (lessons 04 and 11-15 load it with `minwiola.lesson.benchmarks()`;
tests/test_benchmarks_package.py checks that each name they read is there).
"""
