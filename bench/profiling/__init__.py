"""Profiling and measuring scripts for the bench's questions: what a pushed or consumed message costs the client
(instructions, CPU seconds, where they go), what a command costs through the driver, and the payload layouts of
docs/FORMAT.md. Each runs as ``python -m bench.profiling.<name>``; bench/README.md lists them."""
