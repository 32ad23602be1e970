"""The wireless channel model: pure numpy, time-stepped, keyed by seeds.

``radio`` (formulas and rate tables), ``fading``, ``gilbert`` and ``model`` (the per-link
state over time).
"""
