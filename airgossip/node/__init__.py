"""The node runtime: what runs one agent process, on a device or in any fleet, and how a
run's folder and results are laid out.

One agent process: :mod:`.command` is its command line (typed), :mod:`.agent` its main;
:mod:`.options` turns the flags into what the process runs; :mod:`.process` runs one agent
to the end; :mod:`.peers` is where its neighbours and scenario come from; :mod:`.lifecycle`
keeps it from outliving its launcher; :mod:`.threads` sizes its torch threads;
:mod:`.privacy` hands it what ``[privacy]`` needs of the fleet. Its links come from whoever
starts it (:mod:`.links`): the contract of a network is :mod:`.network`, the networks
themselves are the emulation layer's, whose entry point ``python -m
airgossip.emulation.agent`` the process-based fleets start (the CLI's ``airgossip agent``
runs the same code). :mod:`.ray_agent` is what a Ray host actor tells and keeps of its agents.

One run: :mod:`.folder` is what goes where in its folder (and its throwaway credentials);
:mod:`.results_writer` writes ``results.json`` and the plot, whoever ran the agents;
:mod:`.devices` is the run a coordinator holds for agents started by hand
(``airgossip coordinator``).

Below the emulation layer and the CLI: nothing here imports either (the layering test
checks), and importing this package imports none of its modules.
"""
