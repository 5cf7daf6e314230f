"""Content negotiation of the API (settings.REST_FRAMEWORK["DEFAULT_CONTENT_NEGOTIATION_CLASS"])."""

from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.settings import api_settings


class FormatCheckedNegotiation(DefaultContentNegotiation):
    """An unknown ?format= is bad input, answered 400 naming the formats there are; DRF answers 404, as
    if the resource did not exist. (A URL's format suffix is part of the URL: unknown, it stays a 404.)"""

    def select_renderer(self, request, renderers, format_suffix=None):
        requested = None if format_suffix else request.query_params.get(api_settings.URL_FORMAT_OVERRIDE)
        # drf-spectacular offers each schema format twice (two media types each); name each once.
        known = list(dict.fromkeys(renderer.format for renderer in renderers))
        if requested and requested not in known:
            raise ValidationError({api_settings.URL_FORMAT_OVERRIDE: [f"Unknown format; one of: {', '.join(known)}."]})
        return super().select_renderer(request, renderers, format_suffix)
