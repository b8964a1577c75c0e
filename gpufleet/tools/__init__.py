"""Tooling beside the site, never imported by it: the bench, the simulated fleet, made-up
history, worker processes started and stopped, a process tree's footprint, and the
`bench` and `simulate` commands over them. An installed app only so that manage.py finds
those commands; nothing else imports it (tests/test_layout.py checks)."""
