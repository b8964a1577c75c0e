"""`python -m gpufleet.agent`: this host's agent (launch.agent_worker), its node, broker and
data dir from the environment (gpufleet/core/agent_settings.py)."""

import sys

# kombu's JSON encoder imports Django whenever it is installed, as it is where the agent
# shares the site's install; the agent has no use for it (docs/agent.md, footprint).
sys.modules["django"] = None

from gpufleet.agent.app import run  # noqa: E402

run()
