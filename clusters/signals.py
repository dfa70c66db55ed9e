"""Signals apps above clusters listen to (connected from their AppConfig.ready())."""

from django.dispatch import Signal

# Sent while a cluster's delete Operation runs, after the provider removed what it
# made and before the rows go: receivers stop what they run for ``cluster_id``.
cluster_deleting = Signal()
