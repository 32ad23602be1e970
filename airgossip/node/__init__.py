"""The runtime: what an agent process runs and how a run's folder and results are laid out,
used by every fleet and by the CLI.

One agent process: :mod:`.command` is its command line (typed), :mod:`.agent` its entry point,
``python -m airgossip.emulation.runtime.agent``, which the process-based fleets start (the CLI's
``airgossip agent`` runs the same code); :mod:`.options` turns the flags into what the
process runs; :mod:`.process` runs one agent to the end; :mod:`.peers` is where its
neighbours and scenario come from; :mod:`.lifecycle` keeps it from outliving its launcher.

One run: :mod:`.folder` is what goes where in its folder (and its throwaway credentials);
:mod:`.results` writes ``results.json`` and the plot, whoever ran the agents;
:mod:`.devices` is the run a coordinator holds for agents started by hand
(``airgossip coordinator``).

Nothing here imports the fleets or the CLI; importing this package imports none of its
modules (the fork server preloads :mod:`.process` and runs :mod:`.agent` as ``__main__``).
"""
