"""Acceptance rules by name (rules/base.py: the Rule row, the registry and the walk's contract), one
rule a file: exact.py (the default), typical.py, lantern.py, judge.py, rsd.py, kseq.py, unverified.py,
rapid.py. Importing this package registers them all."""
from speclab.decoding.rules import exact, judge, kseq, lantern, rapid, rsd, typical, unverified  # noqa: F401  (each registers its rule)
from speclab.decoding.rules.base import (RULES, Rule, check_run, get_rule, register_rule, registered_rule,  # noqa: F401
                                         rule_params, rules, unregister_rule)
