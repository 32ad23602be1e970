"""The privacy mechanisms, one module and class each (:mod:`.base` says what they declare),
and the registry that names them (:mod:`.registry`). Loading any of them loads no torch."""
