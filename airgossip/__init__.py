"""airgossip: decentralized learning over directed, lossy wireless links."""

__version__ = "0.1.0"
