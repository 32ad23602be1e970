"""The radio and its motion: pure, vectorised, keyed by seeds; no I/O beyond reading a trace.

``radio`` (path loss, noise, rate and error tables), ``fading`` (fast fading in time),
``bursts`` (Gilbert-Elliott bursty loss), ``mobility`` (node motion), ``traces`` (bandwidth
traces) and ``model`` (every directed link's state, one step at a time). Nothing here knows
of agents, links shaping or fleets.
"""
