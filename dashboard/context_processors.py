from django.conf import settings


def site(request):
    return {"site_name": settings.SITE_NAME, "cycle_mode": settings.CYCLE_MODE}
