"""The command line for people who live in terminals.

python manage.py mtc cluster create -f spec.json [--wait]
python manage.py mtc cluster list | get <id> | delete <id> [--wait]
python manage.py mtc cluster resize <id> --pool gpu --nodes 5 [--wait]
python manage.py mtc cluster plan -f spec.json [--json]   # the cloud requests create sends
python manage.py mtc login <id>          # a shell on the cluster's login node
python manage.py mtc bootstrap           # make sure the admin user exists
python manage.py mtc demo                # create the demo cluster if there is none
python manage.py mtc daemons stop        # stop every local cluster's daemons
python manage.py mtc firewall up [--port N ...] | down  # jobs kept off mtc's listeners
python manage.py mtc cgroups             # whether local clusters' jobs are contained here
python manage.py mtc data tokenize IN OUT [--tokenizer F]  # pre-tokenized shards for pretraining
python manage.py mtc gce image build --zone Z [--gpu] [--extras F]  # the gce node image
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.utils import OperationalError, ProgrammingError

from clusters import selectors, services
from clusters.choices import CLUSTER_LIVE_STATES, OperationState
from clusters.demo import DEMO_SPEC
from clusters.models import Cluster, Node, Operation
from clusters.providers import ProviderError, get_provider
from clusters.spec import SpecError, validate_cluster_spec
from node.train.shards import tokenize_argparser, tokenize_command


def database_unmigrated() -> bool:
    """Whether migrations are left to apply (a data dir nobody migrated yet)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        return bool(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    except (OperationalError, ProgrammingError):
        return True


class Command(BaseCommand):
    help = "mtc: clusters from the command line (see `mtc <group> --help`)."

    def add_arguments(self, parser: CommandParser) -> None:
        groups = parser.add_subparsers(dest="group", required=True)
        cluster = groups.add_parser("cluster", help="create, list, get, resize, delete clusters")
        verbs = cluster.add_subparsers(dest="verb", required=True)
        create = verbs.add_parser("create", help="create a cluster from a JSON spec")
        create.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
        create.add_argument("--wait", action="store_true", help="wait until it is RUNNING")
        plan = verbs.add_parser(
            "plan", help="show the exact Compute Engine requests create would send (dry run)"
        )
        plan.add_argument("-f", "--file", required=True, help="spec file, or - for stdin")
        plan.add_argument("--json", action="store_true", help="print the requests as JSON")
        verbs.add_parser("list", help="list clusters")
        get = verbs.add_parser("get", help="show one cluster as JSON")
        get.add_argument("cluster_id")
        delete = verbs.add_parser("delete", help="delete a cluster and everything it made")
        delete.add_argument("cluster_id")
        delete.add_argument("--wait", action="store_true")
        resize = verbs.add_parser("resize", help="set a node pool's node count")
        resize.add_argument("cluster_id")
        resize.add_argument("--pool", required=True)
        resize.add_argument("--nodes", type=int, required=True)
        resize.add_argument("--wait", action="store_true")
        login = groups.add_parser("login", help="open a shell with the cluster's SLURM_CONF")
        login.add_argument("cluster_id")
        groups.add_parser("bootstrap", help="make sure an admin superuser exists")
        groups.add_parser("demo", help="create the demo cluster when no cluster exists")
        fault = groups.add_parser("fault", help="inject or clear a fault on a node")
        fault.add_argument("action", choices=["inject", "clear"])
        fault.add_argument("--cluster", required=True)
        fault.add_argument("--node", required=True)
        fault.add_argument("--kind", help="kill, disk, slow, ecc, xid, dcgm, sdc, gpu-missing")
        daemons = groups.add_parser("daemons", help="local cluster daemons")
        daemons.add_argument("action", choices=["stop"])
        firewall = groups.add_parser(
            "firewall", help="keep jobs' accounts off mtc's listeners (nftables, mtc/firewall.py)"
        )
        firewall.add_argument("action", choices=["up", "down"])
        firewall.add_argument(
            "--port", type=int, action="append", default=[], help="a listener of mtc's"
        )
        groups.add_parser("cgroups", help="whether local clusters' jobs get cgroups here")
        gce = groups.add_parser("gce", help="Compute Engine: the node image")
        gce_nouns = gce.add_subparsers(dest="noun", required=True)
        image_verbs = gce_nouns.add_parser("image", help="the node image").add_subparsers(
            dest="verb", required=True
        )
        build = image_verbs.add_parser(
            "build", help="build the node image (deploy/image/provision.sh) on a builder VM"
        )
        build.add_argument("--zone", required=True, help="where the builder VM runs")
        build.add_argument("--base", default="", help="base image (default: Debian 12)")
        build.add_argument("--machine-type", default="", help="builder machine type")
        build.add_argument(
            "--gpu", action="store_true", help="also deploy/image/gpu-stack.sh (GPU nodes)"
        )
        build.add_argument("--extras", metavar="FILE", help="a script run after the others")
        build.add_argument(
            "--external-ip", action="store_true", help="an external IP (no Cloud NAT)"
        )
        build.add_argument(
            "--keep-builder", action="store_true", help="keep the builder VM after a failure"
        )
        data = groups.add_parser("data", help="training data")
        data_verbs = data.add_subparsers(dest="verb", required=True)
        tokenize_argparser(
            data_verbs.add_parser(
                "tokenize", help="write a pre-tokenized shard set (data_path of a pretraining run)"
            )
        )

    def handle(self, *args, **opts) -> None:
        try:
            self._dispatch(opts)
        except (OperationalError, ProgrammingError) as exc:
            if not database_unmigrated():
                raise
            raise CommandError(
                f"mtc's database ({settings.DATABASES['default']['NAME']}) is not set up yet: "
                "run `python manage.py migrate` (or `make run`) first."
            ) from exc

    def _dispatch(self, opts) -> None:
        group = opts["group"]
        if group == "cluster":
            getattr(self, f"cluster_{opts['verb']}")(opts)
        elif group == "data":
            self.data_tokenize(opts)
        elif group == "gce":
            self.gce_image_build(opts)
        else:
            getattr(self, group)(opts)

    # --- helpers ---------------------------------------------------------
    def _cluster(self, cluster_id: str) -> Cluster:
        try:
            return selectors.cluster_get(cluster_id)
        except Cluster.DoesNotExist as exc:
            raise CommandError(f"No cluster '{cluster_id}'.") from exc

    def _admin(self):
        return get_user_model().objects.filter(is_superuser=True).order_by("pk").first()

    def _wait(self, operation: Operation, *, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            operation.refresh_from_db()
            line = f"{operation.state} {operation.progress}% {operation.status_message}"
            if line != last:
                self.stdout.write(f"  {line}")
                last = line
            if operation.state == OperationState.SUCCEEDED:
                return
            if operation.state == OperationState.FAILED:
                raise CommandError(f"{operation.error_code}: {operation.error_message}")
            time.sleep(0.5)
        raise CommandError(f"Operation {operation.pk} still {operation.state} after {timeout}s.")

    def _print_operation(self, operation: Operation, wait: bool) -> None:
        self.stdout.write(f"operation {operation.pk} {operation.kind} {operation.target}")
        if wait:
            self._wait(operation)

    # --- gce ----------------------------------------------------------------
    def gce_image_build(self, opts) -> None:
        from clusters.providers.gce import image_build
        from clusters.providers.gce.provider import target_for

        extras = ""
        if opts["extras"]:
            try:
                extras = open(opts["extras"]).read()
            except OSError as exc:
                raise CommandError(f"Cannot read the extras script: {exc}") from exc
        try:
            name = image_build.image_build(
                target_for({"zone": opts["zone"]}),
                base_image=opts["base"] or image_build.DEFAULT_BASE,
                machine_type=opts["machine_type"] or image_build.DEFAULT_MACHINE_TYPE,
                extras=extras,
                gpu_stack=opts["gpu"],
                external_ip=opts["external_ip"],
                keep_builder=opts["keep_builder"],
                say=self.stdout.write,
            )
        except ProviderError as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"image {name} is the newest of its family")

    # --- cluster verbs ---------------------------------------------------
    def _read_spec(self, path: str):
        try:
            text = sys.stdin.read() if path == "-" else open(path).read()
            return json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise CommandError(f"Cannot read the spec: {exc}") from exc

    def _spec_error(self, exc: SpecError) -> CommandError:
        lines = "\n".join(f"  {path}: {msg}" for path, msg in exc.fields.items())
        return CommandError(f"Invalid cluster spec:\n{lines}")

    def cluster_plan(self, opts) -> None:
        from clusters.providers.gce.plan import split_files
        from clusters.providers.gce.provider import plan_describe

        try:
            spec = validate_cluster_spec(self._read_spec(opts["file"]))
        except SpecError as exc:
            raise self._spec_error(exc) from exc
        if spec["provider"] != "gce":
            raise CommandError(
                f"Provider '{spec['provider']}' sends no cloud requests; plan is for gce specs."
            )
        described = plan_describe(spec)
        if opts["json"]:
            self.stdout.write(json.dumps(described, indent=2))
            return
        self.stdout.write(
            f"# {len(described['requests'])} Compute Engine and Cloud Monitoring requests for "
            "cluster "
            f"{spec['cluster_id']} in project {described['project']}, zone {described['zone']}"
        )
        access = described["node_access"]
        self.stdout.write(
            f"# nodes run as {access['service_account']}, scopes {' '.join(access['scopes'])}\n"
            f"# metadata server: {access['metadata_server']}\n"
            f"# {len(access['accounts'])} account(s) on every node (name uid:gid home):"
        )
        for a in access["accounts"]:
            self.stdout.write(f"#   {a['name']} {a['uid']}:{a['gid']} {a['home']}")
        for i, request in enumerate(described["requests"], 1):
            when = f"  ({request['when']})" if request.get("when") else ""
            self.stdout.write(f"\n{i}. {request['method']}  {request['http']}{when}")
            if "body" not in request:
                continue
            body, files = split_files(request["body"])
            self.stdout.write(json.dumps(body, indent=2))
            for key, text in files.items():  # startup scripts and configs, as the node sees them
                self.stdout.write(f"--- metadata {key}:\n{text.rstrip()}\n--- end {key}")

        for request in described.get("storage", []):  # Filestore, Lustre, their peering
            when = f"  ({request['when']})" if request.get("when") else ""
            self.stdout.write(f"\nstorage: {request['method']}  {request['http']}{when}")
            if "body" in request:
                self.stdout.write(json.dumps(request["body"], indent=2))

    def cluster_create(self, opts) -> None:
        spec = self._read_spec(opts["file"])
        try:
            operation = services.cluster_create(spec=spec, owner=self._admin())
        except SpecError as exc:
            raise self._spec_error(exc) from exc
        except services.ClusterConflict as exc:
            raise CommandError(str(exc)) from exc
        self._print_operation(operation, opts["wait"])

    def cluster_list(self, opts) -> None:
        row = "{:<24} {:<8} {:<10} {:>7} {:>6}"
        self.stdout.write(row.format("CLUSTER", "PROVIDER", "STATE", "NODES", "GPUS"))
        for c in selectors.cluster_list():
            self.stdout.write(
                row.format(
                    c.cluster_id,
                    c.provider,
                    c.state,
                    f"{c.ready_node_count}/{c.node_count}",
                    c.gpu_count or 0,
                )
            )

    def cluster_get(self, opts) -> None:
        from clusters.api.serializers import ClusterSerializer

        data = ClusterSerializer(self._cluster(opts["cluster_id"])).data
        self.stdout.write(json.dumps(data, indent=2, default=str))

    def cluster_delete(self, opts) -> None:
        operation = services.cluster_delete(
            cluster=self._cluster(opts["cluster_id"]), owner=self._admin()
        )
        self._print_operation(operation, opts["wait"])

    def cluster_resize(self, opts) -> None:
        patch = {
            "node_pools": [
                {
                    "id": opts["pool"],
                    "scaling_spec": {
                        "min_node_count": opts["nodes"],
                        "max_node_count": opts["nodes"],
                    },
                }
            ]
        }
        try:
            operation = services.cluster_update(
                cluster=self._cluster(opts["cluster_id"]), patch=patch, owner=self._admin()
            )
        except SpecError as exc:
            raise CommandError(str(exc)) from exc
        except services.ClusterConflict as exc:
            raise CommandError(str(exc)) from exc
        self._print_operation(operation, opts["wait"])

    # --- other groups ----------------------------------------------------
    def login(self, opts) -> None:
        cluster = self._cluster(opts["cluster_id"])
        provider = get_provider(cluster.provider)
        if cluster.provider != "local":  # SSH to the login node (gcloud, through IAP)
            try:
                command = provider.login_command(cluster)
            except ProviderError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"Login node of {cluster.cluster_id}: {command}\n")
            args = command.split()
            os.execvp(args[0], args)
        conf = str(provider.conf_path(cluster))
        shell = os.environ.get("SHELL", "/bin/bash")
        self.stdout.write(
            f"Login node of {cluster.cluster_id}: SLURM_CONF={conf}\n"
            "sinfo, squeue, sbatch, srun work here; exit to leave.\n"
        )
        env = dict(os.environ, SLURM_CONF=conf, MTC_CLUSTER=cluster.cluster_id)
        env["PS1"] = f"[{cluster.cluster_id}] \\w $ "
        os.execvpe(shell, [shell], env)

    def bootstrap(self, opts) -> None:
        users = get_user_model()
        if users.objects.filter(username="admin").exists():
            self.stdout.write("mtc: user admin exists")
            return
        password = os.environ.get("MTC_ADMIN_PASSWORD")
        generated = not password
        password = password or secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", "admin@localhost", password)
        if generated:
            self.stdout.write(
                f"mtc: created user admin with password {password}  (shown once; "
                "set MTC_ADMIN_PASSWORD to choose it)"
            )
        else:
            self.stdout.write("mtc: created user admin (password from MTC_ADMIN_PASSWORD)")

    def demo(self, opts) -> None:
        if settings.MTC_PROVIDER == "gce":  # a cloud demo would cost money: check, do not create
            self._gce_readiness()
            return
        if Cluster.objects.exists():
            self.stdout.write("mtc: clusters exist; no demo cluster created")
            return
        operation = services.cluster_create(spec=DEMO_SPEC, owner=self._admin())
        self.stdout.write(
            f"mtc: creating the demo cluster (operation {operation.pk}); "
            f"SLURM_CONF={get_provider('local').conf_path(operation.cluster)} sinfo"
        )

    def _gce_readiness(self) -> None:
        """What `make run` prints with MTC_PROVIDER=gce: is the project reachable?"""
        project = settings.MTC_GCE_PROJECT
        self.stdout.write(f"mtc: provider gce, project {project or '(MTC_GCE_PROJECT not set)'}")
        if not project:
            self.stdout.write("mtc: set MTC_GCE_PROJECT (README, 'Running on Compute Engine')")
            return
        if not settings.MTC_GCE_ANONYMOUS:
            try:
                import google.auth

                credentials, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
                who = getattr(credentials, "service_account_email", "") or "user credentials"
                self.stdout.write(f"mtc: Google credentials found ({who})")
            except Exception as exc:  # noqa: BLE001 - google.auth raises several kinds
                self.stdout.write(f"mtc: no Google credentials: {exc}")
                self.stdout.write(
                    "mtc: run `gcloud auth application-default login` or use a VM service account"
                )
                return
        self.stdout.write(
            f"mtc: image {settings.MTC_GCE_IMAGE.replace('{project}', project)}; no demo cluster "
            "is created on gce. Review a spec with `python manage.py mtc cluster plan -f spec.json`"
            ", then create it (API, wizard, or a reference architecture)."
        )

    def fault(self, opts) -> None:
        from health.faults import FaultError, fault_clear, fault_inject

        node = (
            Node.objects.select_related("cluster")
            .filter(cluster__cluster_id=opts["cluster"], name=opts["node"])
            .first()
        )
        if node is None:
            raise CommandError(f"No node '{opts['node']}' in cluster '{opts['cluster']}'.")
        try:
            if opts["action"] == "inject":
                if not opts["kind"]:
                    raise CommandError("--kind is required to inject a fault.")
                result = fault_inject(node=node, kind=opts["kind"])
            else:
                result = fault_clear(node=node, kind=opts["kind"])
        except FaultError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result))

    def data_tokenize(self, opts) -> None:
        """The runtime's own writer (node/train/shards.py): the run reads what it wrote."""
        import argparse

        try:
            tokenize_command(argparse.Namespace(**opts), out=self.stdout)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

    def daemons(self, opts) -> None:
        provider = get_provider("local")
        for cluster in Cluster.objects.filter(provider="local"):
            provider.stop_cluster(cluster)
            self.stdout.write(f"mtc: stopped the daemons of {cluster.cluster_id}")
        live = Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES).count()
        if live:
            self.stdout.write("mtc: the next `make run` starts them again")

    def firewall(self, opts) -> None:
        """Redis's and the database's ports (when on this host) and the ones given."""
        from urllib.parse import urlparse

        from mtc import firewall

        table = firewall.table_for(settings.DATA_DIR)
        if opts["action"] == "down":
            firewall.firewall_remove(table)
            return
        ports = list(opts["port"])
        for url, default in ((settings.REDIS_URL, 6379),):
            parsed = urlparse(url)
            if parsed.hostname in ("127.0.0.1", "localhost", "::1"):
                ports.append(parsed.port or default)
        database = settings.DATABASES["default"]
        if database.get("HOST") in ("127.0.0.1", "localhost", "::1") and database.get("PORT"):
            ports.append(int(database["PORT"]))
        uids = f"{settings.MTC_UID_RANGE},{os.environ.get('MTC_FIREWALL_UIDS', '')}".strip(",")
        why = firewall.firewall_apply(table, uids=firewall.uid_ranges(uids), ports=ports)
        self.stdout.write(firewall.say(why, uids, ports))

    def cgroups(self, opts) -> None:
        from clusters.providers.cgroups import cgroups_problem

        why = cgroups_problem()
        if why is None:
            self.stdout.write(
                "cgroups: local clusters' jobs are contained (cores, memory, GPU devices, "
                "every process; cgroup v1)"
            )
        else:
            self.stdout.write(
                f"cgroups: none ({why}); local clusters' jobs are not contained (no "
                "memory or core limits, a process a job leaves behind outlives it)"
            )
