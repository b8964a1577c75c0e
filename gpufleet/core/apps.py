from django.apps import AppConfig
from django.db import models
from django.db.models.signals import post_migrate
from django.urls import register_converter


class CoreConfig(AppConfig):
    name = "gpufleet.core"
    label = "core"

    def ready(self):
        # Load the Celery app in every Django process (web, commands), so shared
        # tasks bind to it; not in gpufleet/__init__.py, which would drag Celery
        # and Django into every import of the pure domain package.
        import gpufleet.celery  # noqa: F401
        from gpufleet.core.converters import NodeNameConverter
        from gpufleet.core.lookups import AnyOf
        from gpufleet.core.roles import ensure_roles

        models.Field.register_lookup(AnyOf)
        models.ForeignObject.register_lookup(AnyOf)  # which takes only lookups of its own
        # Before any URLconf is read, so every app's urls.py may use <node:name> and
        # <segment:name> (a team's name, say: the same rule for any name in a path).
        register_converter(NodeNameConverter, "node")
        register_converter(NodeNameConverter, "segment")

        # After every app's permissions exist, whichever app migrated last.
        post_migrate.connect(ensure_roles, dispatch_uid="gpufleet.core.ensure_roles")
