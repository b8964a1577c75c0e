"""gpufleet: a dashboard for fleets of NVIDIA GPU hosts running Docker."""
