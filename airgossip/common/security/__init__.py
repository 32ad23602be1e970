"""Who may talk to whom: mutual TLS credentials and channels, and a fleet's certificates."""
