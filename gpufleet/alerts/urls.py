from django.urls import path

from gpufleet.alerts import views

app_name = "alerts"

urlpatterns = [
    path("channels/", views.channel_list, name="channels"),
    path("channels/<int:pk>/edit/", views.channel_edit, name="channel_edit"),
    path("channels/<int:pk>/delete/", views.channel_delete, name="channel_delete"),
    path("channels/<int:pk>/test/", views.channel_test, name="channel_test"),
    path("rules/", views.rule_list, name="rules"),
    path("rules/<int:pk>/edit/", views.rule_edit, name="rule_edit"),
    path("rules/<int:pk>/delete/", views.rule_delete, name="rule_delete"),
    path("silences/", views.silence_list, name="silences"),
    path("silences/<int:pk>/end/", views.silence_end, name="silence_end"),
    path("deliveries/", views.delivery_list, name="deliveries"),
]
