import json

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    """Lets a client ask for text/csv; export views stream their own body, so this only renders errors."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data) if data is not None else ""
