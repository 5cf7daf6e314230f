"""The API's parsers (settings.REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]): bounded before they parse.

DRF's own reads the whole body, however large, and hands Python's decoder a body of any depth (100,000
nested arrays raised RecursionError, a 500). This one reads at most the body limit, refuses NaN and
Infinity (not JSON), bodies nested deeper than broker.limits.JSON_DEPTH_MAX, and NUL characters, which
PostgreSQL cannot store in text or jsonb.
"""

import json

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import FormParser, JSONParser

from broker.limits import JSON_DEPTH_MAX, NUL_REFUSED, json_refusal


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


def too_large_message(limit):
    return f"The request body is larger than the {limit:,} bytes the broker accepts."


def refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge(too_large_message(limit))
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(raw.decode(encoding), parse_constant=refuse_constant)
        except RecursionError as error:
            raise ParseError(f"JSON nested deeper than {JSON_DEPTH_MAX} levels is not accepted.") from error
        except ValueError as error:
            raise ParseError(f"JSON parse error - {error}") from error
        refusal = json_refusal(data)
        if refusal:
            raise ParseError(refusal)
        return data


class NulFreeFormParser(FormParser):
    """The browsable API's form encoding, with the JSON parser's refusal of NUL characters (a name
    reference with one reached the database as a lookup and failed there)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if any("\x00" in key or any("\x00" in value for value in values) for key, values in data.lists()):
            raise ParseError(NUL_REFUSED)
        return data
