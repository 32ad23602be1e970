"""The radio and its motion: pure, vectorised, keyed by seeds; no I/O beyond reading a trace.

``radio`` (path loss, noise, rate and error tables), ``fading`` (fast fading in time),
``bursts`` (Gilbert-Elliott bursty loss), ``mobility`` (node motion), ``traces`` (bandwidth
traces), ``model`` (every directed link's state, one step at a time) and ``sparse`` (only the
links in range, for large fleets), with their parts ``base``, ``state``, ``draws``,
``graph``, ``pairs`` and ``heap``. Nothing here knows of agents, links shaping or fleets.
"""
