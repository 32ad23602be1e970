"""What an agent tells: round records and counters, plain events, its Prometheus metrics."""
