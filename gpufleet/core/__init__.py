"""Plumbing every app uses: who may do what (access, roles), HTMX helpers, the
login middleware, shared template tags and static files, and the command lines
of gpufleet's processes. It imports no gpufleet app."""
