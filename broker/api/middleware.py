"""Limits every request meets before any view, form or parser reads it."""

from urllib.parse import parse_qsl

from django.conf import settings
from django.http import HttpResponse, JsonResponse

from broker.api.parsers import too_large_message

NUL_IN_QUERY = "Null characters are not allowed."


def refusal(request, status, message, fields=()):
    """The API's answer is JSON (naming the query parameters at fault, as every API 400 names its field);
    a page's is one line of text."""
    if request.path.startswith("/api/"):
        body = {field: [message] for field in fields} if fields else {"detail": message}
        return JsonResponse(body, status=status)
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def parameters_with_nul(query_string):
    pairs = parse_qsl(query_string, keep_blank_values=True, errors="replace")
    return sorted({name.replace("\x00", "") or "query" for name, value in pairs if "\x00" in name + value})


def declared_length(request):
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class RequestLimitsMiddleware:
    """A body declared larger than DATA_UPLOAD_MAX_MEMORY_SIZE is answered 413 from its Content-Length
    alone, unread (a 200 MB submission grew the server by 400 MB); a NUL in the query string, which
    PostgreSQL cannot compare with text, is answered 400 for every page and filter at once."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and declared_length(request) > limit:
            return refusal(request, 413, too_large_message(limit))
        with_nul = parameters_with_nul(request.META.get("QUERY_STRING", ""))
        if with_nul:
            return refusal(request, 400, NUL_IN_QUERY, with_nul)
        return self.get_response(request)
