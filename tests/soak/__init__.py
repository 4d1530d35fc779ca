"""The soak run: an hour of mixed work under faults, its history and a checker over it."""
