"""A scenario and what its run writes: the typed settings of a run (``RunConfig``: the agents'
settings, fleet size, graph, network, mode), the wireless table and its named presets, how a
scenario file is read and laid under flags, one-line errors, and the results schema
(``results.json``).

Below the node runtime, the fleets and the CLI, all of which read and write these; nothing
here runs anything. Importing this package imports none of its modules.
"""
