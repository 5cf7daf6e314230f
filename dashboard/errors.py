"""The product's own not-found page, even with DEBUG on.

With DEBUG, Django answers a view's Http404 with its technical page, which lists every URL of the site:
a member who opens another team's workload would read the whole URL map instead of "not found". A
missing URL (no view) still gets the technical page a developer wants."""

from django.http import Http404
from django.shortcuts import render


class NotFoundPageMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, Http404):
            return render(request, "404.html", status=404)
        return None
