from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save

        from .signals import account_on_user_created

        post_save.connect(
            account_on_user_created,
            sender=get_user_model(),
            dispatch_uid="identity.account_on_user_created",
        )
