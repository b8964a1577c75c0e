from django.apps import AppConfig


class AgentConfig(AppConfig):
    name = "gpufleet.agent"
    label = "agent"
