"""The benchmarks: each module is a script that measures something and writes results/NAME.json, run either way:

    python -m benchmarks.NAME [options]      # from the repository root
    python benchmarks/NAME.py [options]      # the form README and the result files record

`common.py` holds what the scripts share. Four lessons import a script to reuse its own analysis on its recorded
result, so these names are the scripts' outside face (tests/test_benchmarks_package.py checks the list against
the lessons):

    module          lesson names
    extrapolation   12     ENCODINGS, best_eval, gap, loss_by_position, plot, stretched, windows
    ssm_bench       13     MIXERS, arm_config, best_eval, compare, plot, probe, probe_windows
    moe_bench       14     ARMS, arm_config, compare, held_out, report, routing
    diffusion_bench 15     ARMS, arm_config, blank_span, compare, counts, plot, report
    layouts_bench   15     DIGITS, SPAN, build, decode, report_sort, sort_configs, sort_evaluate, sort_task, sort_train
"""
