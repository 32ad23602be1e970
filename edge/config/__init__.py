"""What an agent is told: its settings, its algorithm and task options, its id and seeds."""
