"""The gce node image: deploy/image/provision.sh run for real in a debootstrap'd Debian 12
chroot (marker ``image``: root, debootstrap and Debian's mirror), and the image's
contract (clusters/providers/gce/image.py) as the startup and batch scripts use it.

The chroot's base system is cached in /tmp/mtc-image-base-bookworm.tar, the wheels in
/tmp/mtc-image-wheels and apt's .debs in /tmp/mtc-image-apt-cache, so a rerun spends
its time in provision.sh itself. GCE- and GPU-only steps (NVIDIA driver, DCGM, Ops
Agent, gcsfuse, Lustre client, NCCL plugin) are not in the script; docs/gce.md lists them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings

from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.providers.gce import bootstrap, image
from clusters.reference_architectures import architecture_get
from clusters.spec import validate_cluster_spec

from .conftest import make_spec
from .waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / "deploy" / "image"
BASE_TAR = Path("/tmp/mtc-image-base-bookworm.tar")
WHEELS = Path("/tmp/mtc-image-wheels")
APT_CACHE = Path("/tmp/mtc-image-apt-cache")
MIRROR = os.environ.get("MTC_IMAGE_MIRROR", "http://deb.debian.org/debian")
APT_IN_CHROOT = "/var/cache/mtc-apt"  # MTC_APT_CACHE inside the chroot
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}


# --- the contract, without a chroot -------------------------------------------------------
def test_requirements_pin_torch_as_the_project_does():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project_torch = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    lines = (IMAGE_DIR / "requirements-node.txt").read_text().splitlines()
    node_torch = [line for line in lines if line.startswith("torch")]
    assert node_torch == project_torch == ["torch==2.13.0"]


def test_the_provider_boots_the_family_the_script_builds():
    assert image.IMAGE_FAMILY == "mtc-slurm-22-05"
    assert settings.MTC_GCE_IMAGE.endswith("/family/" + image.IMAGE_FAMILY)
    text = (IMAGE_DIR / "provision.sh").read_text()
    assert f"SLURM_SERIES={image.SLURM_SERIES} " in text
    assert f"PREFIX={image.NODE_ROOT} " in text
    assert image.NODE_PYTHON == image.NODE_ROOT + "/venv/bin/python"


def test_node_python_is_mtcs_own_locally_and_the_images_on_gce():
    local, gce = get_provider("local"), get_provider("gce")
    assert local.node_python() == sys.executable
    assert local.node_root() == str(settings.BASE_DIR)
    assert gce.node_python() == "/opt/mtc/venv/bin/python" == image.NODE_PYTHON
    assert gce.node_root() == "/opt/mtc"


def _launch_script(api, cluster_id: str) -> str:
    answer = api.post(
        f"/api/v1/clusters/{cluster_id}/recipes/llama-pretrain/launch",
        {"nodes": 1, "overrides": {"steps": 4}, "dry_run": True},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    return answer.json()["script"]


@pytest.mark.django_db
def test_a_gce_launch_runs_the_images_python_and_a_local_one_mtcs(user_api):
    spec = validate_cluster_spec(architecture_get("a3-ultra-pretraining").build_spec("a3u"))
    Cluster.objects.create(cluster_id="a3u", provider="gce", spec=spec, state="RUNNING")
    Cluster.objects.create(cluster_id="l1", provider="local", spec=make_spec("l1"), state="RUNNING")
    gce = _launch_script(user_api, "a3u")
    assert "export PYTHONPATH=/opt/mtc\n" in gce
    assert "export MTC_PYTHON=/opt/mtc/venv/bin/python " in gce
    assert str(settings.BASE_DIR) not in gce and sys.executable not in gce
    # The rendezvous port is still the first node's pick, with the nodes' python.
    assert 'RDZV_PORT=$("$MTC_PYTHON" -IS -c' in gce
    local = _launch_script(user_api, "l1")
    assert f"export MTC_PYTHON={sys.executable} " in local
    assert f"export PYTHONPATH={settings.BASE_DIR}\n" in local


def test_a_replica_on_gce_runs_the_images_python():
    from serving.services import replica_script

    def script(provider: str) -> str:
        endpoint = SimpleNamespace(
            pk=7,
            name="chat",
            served_model="tiny",
            cpus_per_replica=1,
            cluster=SimpleNamespace(provider=provider),
            version=SimpleNamespace(export_path="/home/.mtc/models/tiny/1"),
        )
        return replica_script(endpoint, 1, Path("/home/.mtc/serving/7/1"))

    assert "exec /opt/mtc/venv/bin/python -m node.replica.server" in script("gce")
    assert "PYTHONPATH=/opt/mtc\n" in script("gce")
    assert f"exec {sys.executable} -m node.replica.server" in script("local")


def test_every_startup_script_checks_the_images_slurm_first():
    spec = validate_cluster_spec(architecture_get("a3-ultra-pretraining").build_spec("a3u"))
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    pool = next(p for p in spec["node_pools"] if p["id"] != login)
    for text in (
        bootstrap.startup_script(spec, role="controller"),
        bootstrap.startup_script(spec, role="worker", pool=pool),
    ):
        check = text.index("slurm_version=$(slurmd -V")
        assert check < text.index("mount_once ") and check < text.index("munge.key")
        assert "@@" not in text


# --- the script for real, in a Debian 12 chroot ---------------------------------------------
def _why_no_chroot() -> str:
    if os.geteuid() != 0:
        return "needs root (chroot, mount)"
    if not shutil.which("debootstrap"):
        return "needs debootstrap (scripts/setup.sh installs it)"
    return ""


def _run(args: list[str], *, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def _in_chroot(root: Path, *args: str, user: str = "", **kwargs) -> subprocess.CompletedProcess:
    chroot = ["chroot", *([f"--userspec={user}"] if user else []), str(root)]
    return _run([*chroot, *args], env=CHROOT_ENV, **kwargs)


def _base_tar() -> Path:
    """Debian 12's base system as a tar (made once with debootstrap, then reused)."""
    if BASE_TAR.exists():
        return BASE_TAR
    work = Path(f"/tmp/mtc-image-debootstrap-{os.getpid()}")
    try:
        made = _run(["debootstrap", "--variant=minbase", "bookworm", str(work), MIRROR])
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        part = BASE_TAR.with_suffix(".part")
        packed = _run(["tar", "-C", str(work), "-cf", str(part), "."])
        assert packed.returncode == 0, packed.stderr
        part.replace(BASE_TAR)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BASE_TAR


def _wheels() -> str:
    """requirements-node.txt's wheels, as pip on this machine resolves them (torch is a
    file on disk here), in a folder the chroot gets a copy of."""
    options = "--no-index --find-links /mnt/mtc-wheels"
    requirements = (IMAGE_DIR / "requirements-node.txt").read_text()
    stamp = WHEELS / ".requirements"  # what the wheels there were downloaded for
    if stamp.exists() and stamp.read_text() == requirements:
        return options
    WHEELS.mkdir(exist_ok=True)
    got = _run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELS)]
        + ["-r", str(IMAGE_DIR / "requirements-node.txt")]
    )
    assert got.returncode == 0, got.stderr[-3000:]
    stamp.write_text(requirements)
    return options


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p.startswith(prefix)]


def _tear_down(root: Path) -> None:
    for point in sorted(_mounts_under(root), reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    # Never delete through a mount that is still there (and rm stays on this file
    # system besides); rm is minutes faster than shutil.rmtree on a whole system.
    if not _mounts_under(root):
        subprocess.run(["rm", "-rf", "--one-file-system", str(root.parent)], check=False)


@pytest.fixture(scope="module")
def provisioned():
    """A Debian 12 chroot that provision.sh has run in, twice (the second must find
    everything done). Yields its root and both runs' output and seconds."""
    if why := _why_no_chroot():
        pytest.skip(why)
    base = _base_tar()
    pip_args = _wheels()
    root = Path(f"/tmp/mtc-image-test-{os.getpid()}") / "root"
    root.mkdir(parents=True)
    try:
        unpacked = _run(["tar", "-C", str(root), "-xf", str(base)])
        assert unpacked.returncode == 0, unpacked.stderr
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        # Hard links: the wheels and .debs cost no copy (all of it is under /tmp).
        APT_CACHE.mkdir(exist_ok=True)
        for there, here in ((WHEELS, "mnt/mtc-wheels"), (APT_CACHE, APT_IN_CHROOT.lstrip("/"))):
            linked = _run(["cp", "-al", str(there), str(root / here)])
            assert linked.returncode == 0, linked.stderr
        source = root / "root" / "mtc-src"
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / "node", source / "node", ignore=ignore)
        shutil.copytree(IMAGE_DIR, source / "deploy" / "image", ignore=ignore)
        assert subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")]).returncode == 0
        env = {"MTC_PIP_ARGS": pip_args, "MTC_APT_CACHE": APT_IN_CHROOT}
        runs = []
        for _ in range(2):
            started = time.monotonic()
            done = _in_chroot(
                root,
                "/usr/bin/env",
                *(f"{k}={v}" for k, v in env.items()),
                "/bin/bash",
                "/root/mtc-src/deploy/image/provision.sh",
            )
            seconds = time.monotonic() - started
            print(f"provision.sh: rc {done.returncode} in {seconds:.0f} s\n{done.stdout}")
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
            runs.append(SimpleNamespace(output=done.stdout, seconds=seconds))
        # Keep the .debs for the next run.
        for deb in (root / APT_IN_CHROOT.lstrip("/")).glob("*.deb"):
            if not (APT_CACHE / deb.name).exists():
                os.link(deb, APT_CACHE / deb.name)
        yield SimpleNamespace(root=root, first=runs[0], second=runs[1])
    finally:
        _tear_down(root)


@pytest.mark.image
def test_the_images_slurm_is_the_series_mtc_speaks(provisioned):
    version = _in_chroot(provisioned.root, "slurmd", "-V")
    assert version.returncode == 0, version.stderr
    # "slurm-wlm 22.05.8": Debian's name, then the release.
    assert version.stdout.split()[1].startswith(image.SLURM_SERIES + "."), version.stdout
    for client in ("slurmctld", "slurmdbd", "sbatch", "scontrol", "sacctmgr"):
        found = _in_chroot(provisioned.root, "sh", "-c", f"command -v {client}")
        assert found.returncode == 0, f"{client} is not on the image"
    # The startup scripts' own check passes on this image, and stops a boot on another.
    check = 'report() { echo "report $1=$2"; }\n' + image.slurm_check_script() + "\necho ok\n"
    passed = _in_chroot(provisioned.root, "bash", "-c", check)
    assert passed.returncode == 0 and passed.stdout.strip() == "ok", passed
    fake = "slurmd() { echo 'slurm 23.11.4'; }\n"
    failed = _in_chroot(provisioned.root, "bash", "-c", fake + check)
    assert failed.returncode == 1, failed
    assert "this image has Slurm 23.11.4, mtc needs 22.05.x" in failed.stderr
    assert "report state=failed: image has Slurm 23.11.4, not 22.05.x" in failed.stdout


@pytest.mark.image
def test_munge_works_with_a_key_and_none_is_baked_in(provisioned):
    root = provisioned.root
    assert not (root / "etc/munge/munge.key").exists()
    # What the startup script does at boot: a key, then munged; here with a test key.
    key, socket = "/run/mtc-test/munge.key", "/run/mtc-test/munge.socket"
    setup = (
        "install -d -o munge -g munge /run/mtc-test /run/munge && "
        f"mungekey -c -k {key} && chown munge:munge {key} && chmod 0400 {key}"
    )
    assert _in_chroot(root, "sh", "-c", setup).returncode == 0
    munged = subprocess.Popen(
        ["chroot", "--userspec=munge:munge", str(root), "munged", "-F", "--key-file", key]
        + ["--socket", socket, "--pid-file", "/run/mtc-test/munged.pid"]
        + ["--seed-file", "/run/mtc-test/munged.seed", "--log-file", "/run/mtc-test/munged.log"],
        env=CHROOT_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: (root / socket.lstrip("/")).exists() or munged.poll() is not None,
            what="munged's socket",
        )
        assert munged.poll() is None, munged.stdout.read() if munged.stdout else ""
        round_trip = _in_chroot(
            root, "sh", "-c", f"munge -n -S {socket} | unmunge -S {socket}", user="nobody:nogroup"
        )
        assert round_trip.returncode == 0, round_trip.stderr
        assert "STATUS:          Success (0)" in round_trip.stdout
    finally:
        munged.terminate()
        munged.wait(timeout=10)
        shutil.rmtree(root / "run/mtc-test", ignore_errors=True)


@pytest.mark.image
def test_the_node_runtime_imports_with_torch_for_any_account(provisioned):
    imported = _in_chroot(
        provisioned.root,
        image.NODE_PYTHON,
        "-c",
        "import node.train, torch; print(torch.__version__)",
        user="nobody:nogroup",
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("2.13.0"), imported.stdout
    release = (provisioned.root / "opt/mtc/image-release").read_text()
    assert "slurm=22.05." in release and "torch=2.13.0" in release


@pytest.mark.image
def test_the_image_holds_no_secrets_and_starts_nothing_itself(provisioned):
    root = provisioned.root
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "etc/slurm/slurmdbd.pass").exists()
    for unit in ("munge", "slurmd", "slurmctld", "slurmdbd", "mariadb"):
        state = _in_chroot(root, "systemctl", "is-enabled", unit)
        assert state.stdout.strip() == "disabled", (unit, state.stdout, state.stderr)
    assert not (root / "usr/sbin/policy-rc.d").exists()
    for path, owner in (("var/spool/slurmctld", "slurm"), ("etc/munge", "munge")):
        got = _in_chroot(root, "stat", "-c", "%U", "/" + path)
        assert got.stdout.strip() == owner, (path, got.stdout)


@pytest.mark.image
def test_provisioning_again_changes_nothing_and_is_quick(provisioned):
    assert "Debian packages: all present" in provisioned.second.output
    assert "installing" not in provisioned.second.output
    assert provisioned.second.output.rstrip().endswith("mtc-image: done")
    print(f"first run {provisioned.first.seconds:.0f} s, again {provisioned.second.seconds:.0f} s")
