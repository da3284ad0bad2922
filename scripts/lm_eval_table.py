#!/usr/bin/env python3
"""Print `linearize eval --json` results (or DIR/results.json) with lm-evaluation-harness's own
table writer, lm_eval.utils.make_table, to show that its tooling reads our results.

Usage: python3 scripts/lm_eval_table.py RESULTS.json [PATH/TO/lm_eval/utils.py]
Needs numpy, pyyaml, jinja2 and pytablewriter; lm_eval itself need not import (its package
imports torch), so utils.py is loaded from its file: by default from an installed lm_eval.
"""
import importlib.util
import json
import sys


def load_utils(path):
    if path is None:
        spec = importlib.util.find_spec("lm_eval")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("lm_eval is not installed; pass the path of its lm_eval/utils.py")
        path = spec.submodule_search_locations[0] + "/utils.py"
    spec = importlib.util.spec_from_file_location("lm_eval_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        results = json.load(f)
    utils = load_utils(sys.argv[2] if len(sys.argv) == 3 else None)
    print(utils.make_table(results))


if __name__ == "__main__":
    main()
