from rest_framework.pagination import LimitOffsetPagination


class BrokerPagination(LimitOffsetPagination):
    """?limit=&offset= pages, capped so one request cannot pull a 4,000-node inventory's every device."""

    max_limit = 1000
