from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "gpufleet.api"
    label = "api"

    def ready(self):
        from gpufleet.api.auth import token_user
        from gpufleet.core.access import use_api_tokens

        # The pages' exports take the API's tokens too; core cannot import this app.
        use_api_tokens(token_user)
