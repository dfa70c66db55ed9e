from django.contrib import admin

from .models import Cluster, Node, NodePool, Operation


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["cluster_id", "provider", "state", "create_time"]
    list_filter = ["provider", "state"]
    search_fields = ["cluster_id", "display_name"]


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ["cluster", "pool_id", "machine_type", "target_node_count", "is_login"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "pool", "slurm_state", "health", "port"]
    list_filter = ["slurm_state", "health"]
    search_fields = ["name"]


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "target", "state", "progress", "create_time"]
    list_filter = ["kind", "state"]
