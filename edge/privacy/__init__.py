"""Differential privacy for the agents' training data: ``[privacy]`` settings
(:mod:`.settings`), the mechanisms, one class each, and their registry
(:mod:`.mechanisms`), private steps through Opacus (:mod:`.training`), accountants
(:mod:`.accounting`), what the graph does to a guarantee (:mod:`.graph`), pairwise keys and
cancelling masks (:mod:`.keys`, :mod:`.masks`), the noise of a run (:mod:`.plan`), resolved
once and carried to every agent (:mod:`.noise`), and the agent's seam (:mod:`.mechanism`).
Nothing here is imported unless a run asks for privacy, but for the settings and the
registry, which load no torch.
"""
