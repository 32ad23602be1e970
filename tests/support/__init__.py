"""What tests share, one module per purpose:

* :mod:`tests.support.cli`: the command line in and out of process, and its one-line errors;
* :mod:`tests.support.processes`: real processes and ports (free ports, finding and killing
  what a test started);
* :mod:`tests.support.local_fleet`: :class:`LocalFleet`, a coordinator and agents as OS
  processes that a test kills and restarts one by one, watched through ``/fleet`` and records;
* :mod:`tests.support.lossy`: :class:`AlgorithmFleet`, the tests' one lossy-network simulator:
  gossip algorithms with no agents and no transport on a network that loses, duplicates,
  reorders and drops acknowledgements from one seed;
* :mod:`tests.support.inproc`: a scenario's settings run by the project's lock-step fleet;
* :mod:`tests.support.tls`: the test session's certificate authority and its identities;
* :mod:`tests.support.agents`: agents in this process serving real gRPC (pairs, a consensus
  fleet under attack, pushes with a chosen certificate), a hand-moved clock, an event recorder;
* :mod:`tests.support.prometheus`: promtool's verdict on an exposition, and Debian's
  Prometheus scraping what a test names (rules evaluated every second).
"""
