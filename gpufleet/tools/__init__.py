"""Tooling beside the site, never imported by it: the bench, the simulated fleet, made-up
history, worker processes started and stopped, a process tree's footprint. Only the
`bench` and `simulate` management commands (thin: they parse options and call these)
and the tests import it (tests/test_layout.py checks)."""
