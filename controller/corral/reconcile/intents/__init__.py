"""The Intent controller: gather the facts, let `decide` judge, then act on what it returned (grants, rate
limits, dispatch to the Device's target).
"""
