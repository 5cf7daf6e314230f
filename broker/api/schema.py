"""The error answers every API operation can give, written into the OpenAPI schema.

drf-spectacular documents the answers a view declares, which for most views is only their success. A
generated client then treats a 400 with field errors, a 404 or a 409 as an undocumented surprise.
These are the answers every view gives through DRF and broker.api.mixins, so they are added to each
operation that can give them (`document_errors`, a postprocessing hook):

- 400: the request's fields did not validate (a body, or a filter or report parameter): field name to
  messages, `non_field_errors` for the whole; a malformed body, `{"detail": ...}`;
- 403: not signed in, a bad token, or a role that may not do this (session authentication comes first
  and sends no challenge, so DRF answers 403 rather than 401);
- 404: no such object, or one the caller may not see;
- 409: the object's state does not allow the action, or it is still in use and cannot be deleted;
- 413: a body larger than the limit (broker.api.middleware), refused before it is read.
"""

from drf_spectacular.views import SpectacularAPIView

ERROR_DETAIL = {
    "type": "object",
    "description": "Why the request was refused, in one sentence.",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
FIELD_ERRORS = {
    "type": "object",
    "description": (
        "Field name (or non_field_errors) to its messages; nested fields nest. A body that is not valid "
        "JSON gets {detail} instead."
    ),
    "additionalProperties": {
        "oneOf": [{"type": "array", "items": {}}, {"type": "object"}, {"type": "string"}],
    },
}

ERRORS = {
    "400": ("FieldErrors", "The request did not validate; nothing was changed."),
    "403": ("ErrorDetail", "Not signed in, a bad token, or a role that may not do this."),
    "404": ("ErrorDetail", "No such object, or one the caller may not see."),
    "409": ("ErrorDetail", "Its state does not allow this, or it is still in use; nothing was changed."),
    "413": ("ErrorDetail", "The body is larger than the broker accepts (MAX_REQUEST_BODY_BYTES); it was not read."),
}
WITH_BODY = ("post", "put", "patch")
UNSAFE = (*WITH_BODY, "delete")


def error_statuses(path, method, operation):
    """The error answers the operation at `path` can give, by what it takes."""
    statuses = []
    queried = any(parameter.get("in") == "query" for parameter in operation.get("parameters", ()))
    if method in WITH_BODY or queried:
        statuses.append("400")
    if {} not in operation.get("security", []):  # {}: anyone may call it (the token endpoint)
        statuses.append("403")
    if "{" in path:
        statuses.append("404")
        if method in UNSAFE:
            statuses.append("409")
    if method in WITH_BODY:
        statuses.append("413")
    return statuses


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: add ERRORS to every operation that can give them, keeping
    any answer a view documented itself."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorDetail", ERROR_DETAIL)
    schemas.setdefault("FieldErrors", FIELD_ERRORS)
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status in error_statuses(path, method, operation):
                component, description = ERRORS[status]
                operation["responses"].setdefault(
                    status,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}},
                    },
                )
    return result


class SchemaView(SpectacularAPIView):
    """The OpenAPI schema, YAML unless asked otherwise. Its refusals (an unknown ?format=) are JSON: DRF
    renders an error with the first renderer, and the schema's YAML renderer turns error details into
    tagged objects that a client cannot read as field errors."""

    def perform_content_negotiation(self, request, force=False):
        if force:
            for renderer in self.get_renderers():
                if renderer.format == "json":
                    return renderer, renderer.media_type
        return super().perform_content_negotiation(request, force)
