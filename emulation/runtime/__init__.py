"""The runtime: what an agent process runs and how a run's folder and results are laid out,
used by every fleet and by the CLI.

:mod:`.command` is an agent process's command line (typed); :mod:`.agent` its entry point,
``python -m emulation.runtime.agent``, which the process-based fleets start (the CLI's
``airgossip agent`` runs the same code); :mod:`.options` turns the flags into what the
process runs; :mod:`.process` runs one agent to the end; :mod:`.peers` is where its
neighbours and scenario come from; :mod:`.lifecycle` keeps it from outliving its launcher.

Nothing here imports the fleets or the CLI; importing this package imports none of its
modules (the fork server preloads :mod:`.process` and runs :mod:`.agent` as ``__main__``).
"""
