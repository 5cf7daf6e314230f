"""Filter backends of the API (settings.REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"])."""

from rest_framework.exceptions import ValidationError
from rest_framework.filters import SearchFilter


class KeyedSearchFilter(SearchFilter):
    """DRF's ?search=, whose refusals (a null character) name the parameter, as every other 400 of the
    API names its field: DRF's own answers with a bare list, which no client can tie to a field."""

    def get_search_terms(self, request):
        try:
            return super().get_search_terms(request)
        except ValidationError as error:
            raise ValidationError({self.search_param: error.detail}) from error
