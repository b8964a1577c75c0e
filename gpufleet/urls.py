from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path

from gpufleet.api import feeds
from gpufleet.api.metrics import metrics_view
from gpufleet.claims import team_page
from gpufleet.fleet import views as fleet_views
from gpufleet.sso import oidc
from gpufleet.sso import views as sso_views
from gpufleet.teams import urls as teams_urls

urlpatterns = [
    path("accounts/login/", sso_views.SignInView.as_view(), name="login"),
    # Ends the session here and, for a person who came through the OpenID provider, there too.
    path("accounts/logout/", oidc.LogoutView.as_view(), name="logout"),
    path("accounts/", include("gpufleet.sso.urls")),
    path("oidc/", include("gpufleet.sso.oidc_urls")),
    path("admin/", admin.site.urls),
    path("healthz", fleet_views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Browsers and tools ask for /favicon.ico whatever the page links.
    path("favicon.ico", login_not_required(lambda request: HttpResponsePermanentRedirect(static("gpufleet/favicon.ico"))),
         name="favicon"),
    path("api/", include("gpufleet.api.urls")),
    path("tokens/", include("gpufleet.api.token_urls")),
    # A calendar feed: no login, its secret in the URL (gpufleet/api/feeds.py).
    path("calendar/<str:secret>.ics", feeds.feed, name="calendar_feed"),
    path("claims/", include("gpufleet.claims.urls")),
    path("teams/", include((teams_urls.urlpatterns + [path("<segment:name>/", team_page.team_detail, name="detail")],
                            teams_urls.app_name))),
    path("alerts/", include("gpufleet.alerts.urls")),
    path("usage/", include("gpufleet.usage.urls")),
    path("", include("gpufleet.jobs.urls")),
    path("", include("gpufleet.audit.urls")),
    path("", include("gpufleet.events.urls")),
    path("", include("gpufleet.fleet.urls")),
]

# A request refused before any view (a NUL in the query, say): JSON on the API.
handler400 = "gpufleet.api.views.bad_request"
