"""Names that vulture calls unused in gpufleet/ but that are used by name, for
tests/test_dead_code.py: vulture reads this file as code that uses them. A name here is
spared everywhere, so keep to names that frameworks, templates or getattr use; real dead
code goes, rather than coming here. Regenerate candidates with
`.venv/bin/vulture gpufleet --min-confidence 60 --make-whitelist` (and the test's options)."""

# ruff: noqa: B018, F821

# Django's settings and its apps' (django-axes, Celery with the CELERY_ namespace, whitenoise,
# django-csp): read by the libraries, not by gpufleet's code. GPUFLEET_HISTORY_*: named by
# gpufleet/fleet/history.py's Series, read with getattr.
ALLOWED_HOSTS
AUTHENTICATION_BACKENDS
AUTH_PASSWORD_VALIDATORS
AXES_CLIENT_IP_CALLABLE
AXES_COOLOFF_TIME
AXES_LOCKOUT_PARAMETERS
AXES_LOCKOUT_TEMPLATE
AXES_RESET_ON_SUCCESS
AXES_USERNAME_CALLABLE
AXES_WHITELIST_CALLABLE
CELERY_BEAT_SCHEDULE
CELERY_BROKER_TRANSPORT_OPTIONS
CELERY_DB_REUSE_MAX
CELERY_TASK_ALWAYS_EAGER
CELERY_TASK_DEFAULT_QUEUE
CELERY_TASK_ROUTES
CONTENT_SECURITY_POLICY
CSRF_COOKIE_HTTPONLY
CSRF_COOKIE_SECURE
CSRF_FAILURE_VIEW
CSRF_TRUSTED_ORIGINS
DEFAULT_AUTO_FIELD
DEFAULT_FROM_EMAIL
EMAIL_HOST_PASSWORD
EMAIL_HOST_USER
EMAIL_PORT
EMAIL_TIMEOUT
EMAIL_USE_TLS
GPUFLEET_HISTORY_5M_DAYS
GPUFLEET_HISTORY_HOURLY_DAYS
GPUFLEET_HISTORY_RAW_HOURS
INSTALLED_APPS
LANGUAGE_CODE
LOGGING
LOGIN_REDIRECT_URL
LOGIN_URL
LOGOUT_REDIRECT_URL
MIDDLEWARE
ROOT_URLCONF
SECURE_CONTENT_TYPE_NOSNIFF
SECURE_HSTS_INCLUDE_SUBDOMAINS
SECURE_HSTS_PRELOAD
SECURE_HSTS_SECONDS
SECURE_PROXY_SSL_HEADER
SECURE_REDIRECT_EXEMPT
SECURE_SSL_REDIRECT
SESSION_COOKIE_HTTPONLY
STATIC_ROOT
STATIC_URL
STORAGES
TEMPLATES
TIME_ZONE
USE_I18N
USE_TZ
WHITENOISE_USE_FINDERS
WSGI_APPLICATION
X_FRAME_OPTIONS

# Found by Django by name or by a dotted path in the settings (app configs and command classes
# are spared in the test): the admin site, middleware, management commands' options, context
# processors, URL conf and WSGI/ASGI entry points.
help  # gpufleet/agent/management/commands/agent.py
_.add_arguments  # gpufleet/agent/management/commands/doctor.py
app_name  # gpufleet/api/token_urls.py
application  # gpufleet/asgi.py
access_context  # gpufleet/core/access.py
default_site  # gpufleet/core/admin_config.py
FleetAdminSite  # gpufleet/core/admin_site.py
throttled_username  # gpufleet/core/login.py
LoginRequiredHtmxMiddleware  # gpufleet/core/middleware.py
RefuseNulMiddleware  # gpufleet/core/middleware.py
LocalBackend  # gpufleet/sso/backends.py: AUTHENTICATION_BACKENDS
OIDCBackend  # gpufleet/sso/oidc.py: AUTHENTICATION_BACKENDS
ProxyBackend  # gpufleet/sso/proxy.py: AUTHENTICATION_BACKENDS
TrustedProxyMiddleware  # gpufleet/sso/proxy.py: MIDDLEWARE
unthrottled  # gpufleet/sso/backends.py: AXES_WHITELIST_CALLABLE
RecheckMiddleware  # gpufleet/sso/recheck.py: MIDDLEWARE
groups_of  # gpufleet/sso/ldap.py and oidc.py: recheck.ASK names them
recheck_directory  # gpufleet/sso/tasks.py: CELERY_BEAT_SCHEDULE
provider_logout_url  # gpufleet/sso/oidc.py: mozilla-django-oidc's OIDC_OP_LOGOUT_URL_METHOD
handler400  # gpufleet/urls.py
disabled  # gpufleet/alerts/channels.py: read by logging on each record

# Django's class options: admin, model Meta, forms, django-filter (method= names its methods
# by string), lookups; and methods that override a library's (admin permissions, ninja's
# auth, pagination and renderer, a form field's valid_value). A parameter an override
# must take (extra_context) or a signal handler's (frame).
list_display  # gpufleet/api/admin.py
list_filter  # gpufleet/api/admin.py
list_select_related  # gpufleet/api/admin.py
autocomplete_fields  # gpufleet/teams/admin.py
fieldsets  # gpufleet/teams/admin.py
from_directory  # gpufleet/teams/models.py, shown in the team admin
readonly_fields  # gpufleet/api/admin.py
search_fields  # gpufleet/api/admin.py
_._get_key  # gpufleet/api/auth.py
# mozilla-django-oidc's hooks, overridden in gpufleet/sso/oidc.py; a TemplateView's template.
_.get_settings
_.get_payload_data
_.get_or_create_user
_.login_failure
_.template_name  # gpufleet/sso/views.py
_.authenticate  # gpufleet/api/auth.py
_.get_or_build_user  # gpufleet/sso/ldap.py: django-auth-ldap's hook for the user of a directory entry
_.clean_name  # gpufleet/api/forms.py
_.clean_url  # gpufleet/alerts/forms.py
help_texts  # gpufleet/api/forms.py
widgets  # gpufleet/api/forms.py
ordering  # gpufleet/api/models.py
verbose_name  # gpufleet/api/models.py
Input  # gpufleet/api/pagination.py
Output  # gpufleet/api/pagination.py
_.paginate_queryset  # gpufleet/api/pagination.py
items_attribute  # gpufleet/api/pagination.py
model_config  # gpufleet/api/schemas.py
duration_hours  # gpufleet/api/schemas.py (an answer's key) and gpufleet/claims/forms.py (a form field, read from cleaned_data)
min_vram_gib  # gpufleet/claims/forms.py: a form field, read from cleaned_data
_.get_content_type  # gpufleet/api/views.py
verbose_name_plural  # gpufleet/audit/models.py
_._state  # gpufleet/claims/filters.py
_._search  # gpufleet/claims/filters.py
q  # gpufleet/claims/filters.py
_.valid_value  # gpufleet/claims/forms.py
widget  # gpufleet/claims/forms.py
constraints  # gpufleet/claims/models.py
_._applied_elsewhere  # gpufleet/claims/use.py
_.has_add_permission  # gpufleet/core/admin.py
_.has_change_permission  # gpufleet/core/admin.py
_.has_delete_permission  # gpufleet/core/admin.py
_.has_permission  # gpufleet/core/admin_site.py
extra_context  # gpufleet/core/admin_site.py
site_header  # gpufleet/core/admin_site.py
site_title  # gpufleet/core/admin_site.py
_.as_postgresql  # gpufleet/core/lookups.py
_._muted  # gpufleet/events/filters.py
_._since  # gpufleet/events/filters.py
_._state  # gpufleet/events/filters.py
_._until  # gpufleet/events/filters.py
lookup_name  # gpufleet/core/lookups.py
frame  # gpufleet/core/management/commands/up.py
_.has_forget_permission  # gpufleet/fleet/admin.py
actions  # gpufleet/fleet/admin.py
date_hierarchy  # gpufleet/fleet/admin.py
inlines  # gpufleet/fleet/admin.py
_._filter_health  # gpufleet/fleet/filters.py
_._filter_offline  # gpufleet/fleet/filters.py
_._filter_q  # gpufleet/fleet/filters.py
per  # gpufleet/fleet/filters.py
abstract  # gpufleet/fleet/models.py

# Model and form fields, choices and dataclass fields: written and read by the ORM, forms,
# pydantic and templates, or by getattr over a list of names (the chart's measures).
author  # gpufleet/alerts/models.py
claim_token  # gpufleet/alerts/models.py
claimed_at  # gpufleet/alerts/models.py
enabled  # gpufleet/alerts/models.py
CLAIM_CREATE  # gpufleet/audit/models.py
CLAIM_DELETE  # gpufleet/audit/models.py
CLAIM_UPDATE  # gpufleet/audit/models.py
GPU_FORGET  # gpufleet/audit/models.py
GROUP_CREATE  # gpufleet/audit/models.py
GROUP_DELETE  # gpufleet/audit/models.py
GROUP_UPDATE  # gpufleet/audit/models.py
NODE_DIAGNOSE  # gpufleet/audit/models.py
NODE_ENROLL  # gpufleet/audit/models.py
NODE_FIX  # gpufleet/audit/models.py
NODE_REVOKE_KEY  # gpufleet/audit/models.py
NODE_ROTATE_KEY  # gpufleet/audit/models.py
TOKEN_CREATE  # gpufleet/audit/models.py
TOKEN_REVOKE  # gpufleet/audit/models.py
FEED_CREATE  # gpufleet/audit/models.py
FEED_REVOKE  # gpufleet/audit/models.py
TEAM_CREATE  # gpufleet/audit/models.py
TEAM_DELETE  # gpufleet/audit/models.py
TEAM_UPDATE  # gpufleet/audit/models.py
USER_CREATE  # gpufleet/audit/models.py
USER_DELETE  # gpufleet/audit/models.py
USER_UPDATE  # gpufleet/audit/models.py
XID_ACKNOWLEDGE  # gpufleet/audit/models.py
min_free_vram_gib  # gpufleet/claims/forms.py
worsened_at  # gpufleet/events/models.py
_.worsened_at  # gpufleet/events/services.py
whole_node  # gpufleet/claims/forms.py
start_reminded_at  # gpufleet/claims/models.py: read by ORM lookups (gpufleet/usage/reminders.py)
end_reminded_at  # gpufleet/claims/models.py
_.start_reminded_at  # gpufleet/claims/services.py
_.end_reminded_at  # gpufleet/claims/services.py
power_draw_w_max  # gpufleet/fleet/charts.py
power_peak_w  # gpufleet/fleet/charts.py
temperature_c_max  # gpufleet/fleet/charts.py
temperature_peak  # gpufleet/fleet/charts.py
util_peak  # gpufleet/fleet/charts.py
utilization_percent_max  # gpufleet/fleet/charts.py
vram_peak_mib  # gpufleet/fleet/charts.py
vram_used_mib_max  # gpufleet/fleet/charts.py
_.issued_at  # gpufleet/fleet/credentials.py
CENTRE_ONLY_CODE  # gpufleet/fleet/models.py
gpu_models  # gpufleet/fleet/models.py
issued_at  # gpufleet/fleet/models.py
power_draw_w_avg  # gpufleet/fleet/models.py
power_draw_w_min  # gpufleet/fleet/models.py
refused_since  # gpufleet/fleet/models.py
refused_total  # gpufleet/fleet/models.py
simulated  # gpufleet/fleet/models.py
temperature_c_avg  # gpufleet/fleet/models.py
temperature_c_min  # gpufleet/fleet/models.py
utilization_percent_avg  # gpufleet/fleet/models.py
utilization_percent_min  # gpufleet/fleet/models.py
vram_used_mib_avg  # gpufleet/fleet/models.py
vram_used_mib_min  # gpufleet/fleet/models.py
chart  # gpufleet/fleet/nodes.py
ecc_corrected_volatile  # gpufleet/gpu/devices.py
ecc_mode  # gpufleet/gpu/devices.py
ecc_uncorrected_aggregate  # gpufleet/gpu/devices.py
fan_percent  # gpufleet/gpu/devices.py
memory_temperature_c  # gpufleet/gpu/devices.py
pstate  # gpufleet/gpu/devices.py
remapped_rows_correctable  # gpufleet/gpu/devices.py
remapped_rows_uncorrectable  # gpufleet/gpu/devices.py
sm_clock_max_mhz  # gpufleet/gpu/devices.py
sm_clock_mhz  # gpufleet/gpu/devices.py
# Reported and stored (doctor JSON, snapshot, the GPU's health): no finding reads them yet.
power_draw_average_w  # gpufleet/gpu/devices.py
sw_power_cap_us  # gpufleet/gpu/devices.py
sw_thermal_slowdown_us  # gpufleet/gpu/devices.py
hw_thermal_slowdown_us  # gpufleet/gpu/devices.py
hw_power_brake_slowdown_us  # gpufleet/gpu/devices.py
sync_boost_us  # gpufleet/gpu/devices.py
schema_version  # gpufleet/ingest/schema.py
_.gpu_models  # gpufleet/ingest/services.py
finished_at  # gpufleet/jobs/models.py
requested_by  # gpufleet/jobs/models.py
started_at  # gpufleet/jobs/models.py

# Read only by templates.
_.active  # gpufleet/core/filters.py
_.after_text  # gpufleet/claims/views.py
_.before_text  # gpufleet/claims/views.py
_.may_change  # gpufleet/claims/views.py
_.only_team  # gpufleet/claims/forms.py
_.duration  # gpufleet/events/models.py
_.kind_labels  # gpufleet/alerts/models.py
_.is_open  # gpufleet/events/models.py
_.muted_as  # gpufleet/events/models.py
_.lacks_valid_key  # gpufleet/fleet/models.py
_.remote_fix  # gpufleet/fleet/nodes.py
_.svg_width  # gpufleet/fleet/charts.py
_.svg_x  # gpufleet/fleet/charts.py
_.more_query  # gpufleet/fleet/summary.py
_.as_of  # gpufleet/fleet/summary.py
_.end_index  # gpufleet/fleet/filters.py
_.text_y  # gpufleet/usage/charts.py
_.reserved_y  # gpufleet/usage/charts.py
_.reserved_width  # gpufleet/usage/charts.py
_.used_y  # gpufleet/usage/charts.py
_.used_width  # gpufleet/usage/charts.py
_.reserved_text_x  # gpufleet/usage/charts.py
_.used_text_x  # gpufleet/usage/charts.py
_.reserved_text_y  # gpufleet/usage/charts.py
_.used_text_y  # gpufleet/usage/charts.py
_.bar_height  # gpufleet/usage/charts.py
_.plot_width  # gpufleet/usage/charts.py

# The questions other apps ask of a node's maintenance, used by tests until they do.
is_in_maintenance  # gpufleet/fleet/maintenance.py

# Used by tests only: the tests' way into what the site runs (the chart's segments,
# the consumer's handling of entries, a diagnosis's worst finding), and the direction
# an agent's signature would carry, which a test forges to show the agent refuses it.
in_process  # gpufleet/ingest/stream.py
segments  # gpufleet/fleet/charts.py
_.worst_status  # gpufleet/gpu/diagnosis.py
TO_CENTRE  # gpufleet/wire.py

# Usage rows' figures are summed in SQL by name (gpufleet/usage/record.py, rollup.py, report.py).
_.seen_s  # gpufleet/usage/models.py
_.used_s  # gpufleet/usage/models.py
_.unknown_s  # gpufleet/usage/models.py

# A DCGM diagnostic job's result as the templates read it (templates/jobs/job.html, dcgm_panel.html).
_.diag  # gpufleet/jobs/models.py

# A team's quota standing as templates/teams/_quota.html reads it, and that partial's
# context, which the team page (/teams/<name>/) gives it; tests render it until then.
team_quota_context  # gpufleet/claims/quota.py
_.gpus_now  # gpufleet/gpu/quota.py
_.bookings_ahead  # gpufleet/gpu/quota.py
_.gpu_hours_ahead  # gpufleet/gpu/quota.py
_.month_so_far  # gpufleet/gpu/quota.py
_.month_total  # gpufleet/gpu/quota.py
