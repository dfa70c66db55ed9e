from django.shortcuts import render

from . import selectors


def dashboard(request):
    return render(request, "clusters/dashboard.html", {"clusters": selectors.cluster_list()})
