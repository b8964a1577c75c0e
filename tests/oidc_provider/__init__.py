"""A real OpenID provider for the tests: django-oauth-toolkit's, in a Django project of its own
that tests/sso/provider.py runs as a second process on loopback. Never part of the site."""
