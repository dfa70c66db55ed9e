from django.apps import AppConfig


class MtcConfig(AppConfig):
    name = "mtc"

    def ready(self) -> None:
        # Django's development server (what `make run` serves with) writes a response's
        # headers and body in two sends; on a kept-alive connection Nagle's algorithm
        # then holds the body until the client's delayed ACK, about 40 ms a request.
        from django.core.servers.basehttp import WSGIRequestHandler

        WSGIRequestHandler.disable_nagle_algorithm = True
