
# --- a compute node: configless slurmd that registers itself (dynamic node) ----------
install -d /var/spool/slurmd /var/log/slurm /etc/slurm
meta mtc-prolog >/etc/slurm/mtc-prolog.sh
meta mtc-epilog >/etc/slurm/mtc-epilog.sh
chmod 0755 /etc/slurm/mtc-prolog.sh /etc/slurm/mtc-epilog.sh

# --- GPUs: the driver's daemons, DCGM, and the Ops Agent's DCGM receiver (v2) --------
if [ @@GPUS@@ -gt 0 ]; then
  for unit in nvidia-persistenced nvidia-dcgm google-cloud-ops-agent; do
    systemctl cat "$unit" >/dev/null 2>&1 || fail "the image has no $unit (build it with deploy/image)"
  done
  systemctl enable --now nvidia-persistenced || fail "nvidia-persistenced did not start"
  # NVSwitch machines (A3, A4) need the fabric manager before CUDA sees the GPUs.
  if systemctl cat nvidia-fabricmanager >/dev/null 2>&1; then
    systemctl enable --now nvidia-fabricmanager || fail "nvidia-fabricmanager did not start"
  fi
  systemctl enable --now nvidia-dcgm || fail "nvidia-dcgm did not start"
  # Version 2 of the receiver: the curated GPU metrics mtc's dashboard and health read.
  install -d /etc/google-cloud-ops-agent
  cat >/etc/google-cloud-ops-agent/config.yaml <<'YAML'
metrics:
  receivers:
    dcgm:
      type: dcgm
      receiver_version: 2
  service:
    pipelines:
      dcgm:
        receivers: [dcgm]
YAML
  systemctl restart google-cloud-ops-agent || fail "the Ops Agent did not start with the DCGM receiver"
fi

# --- the health agent, as Slurm's HealthCheckProgram (slurm.conf names it) -----------
# The agent's quick checks drain this node themselves on a critical finding; slurmd runs
# them at start, so a node that fails them never takes work.
[ -x @@NODE_PYTHON@@ ] && [ -f @@NODE_HOME@@/node/agent/mtc_agent.py ] \
  || fail "the image has no mtc node runtime at @@NODE_HOME@@ (build it with deploy/image)"
install -d -m 0755 /etc/mtc /var/lib/mtc
cat >/etc/mtc/agent.json <<JSON
{"node": "$(hostname -s)", "expected_gpus": @@GPUS@@, "disk_paths": ["/"],
 "disk_min_free_pct": 5, "disk_min_free_gb": 5}
JSON
cat >@@HEALTH_CHECK@@ <<'CHECK'
#!/bin/sh
# Written by mtc's startup script: the node agent's quick checks, draining on failure.
trigger="${1:-healthcheck}"
case "$trigger" in healthcheck|prolog|epilog) ;; *) trigger=healthcheck ;; esac
exec @@NODE_PYTHON@@ -I @@NODE_HOME@@/node/agent/mtc_agent.py --node "$(hostname -s)" \
  --config /etc/mtc/agent.json --once --checks @@CHECKS@@ --dcgm-level 1 \
  --trigger "$trigger" --state-file /var/lib/mtc/healthcheck-state.json \
  --output /var/lib/mtc/healthcheck.json --slurm-drain >/dev/null 2>>/var/log/mtc-healthcheck.log
CHECK
chmod 0755 @@HEALTH_CHECK@@

# --- slurmd: after the controller answers, restarted by systemd if it dies ------------
# Configless: slurmd fetches slurm.conf from slurmctld, so it cannot start before it.
controller_up() { timeout 3 bash -c ': </dev/tcp/@@CONTROLLER@@/6817' 2>/dev/null; }
for _ in $(seq 150); do controller_up && break; sleep 2; done
controller_up || fail "slurmctld on @@CONTROLLER@@:6817 did not answer in 5 minutes"
# A drop-in, because systemd does not honour quotes inside an EnvironmentFile variable.
mkdir -p /etc/systemd/system/slurmd.service.d
cat >/etc/systemd/system/slurmd.service.d/mtc.conf <<CONF
[Service]
ExecStart=
ExecStart=$(command -v slurmd) -D -s -Z --conf-server @@CONTROLLER@@ --conf "Feature=@@POOL@@@@GRES@@"
Restart=always
RestartSec=5
CONF
systemctl daemon-reload
# Not enabled: at boot slurmd waits for this script (the metadata rule, the accounts).
systemctl disable slurmd >/dev/null 2>&1 || true
systemctl restart slurmd
registered() {
  scontrol show node "$(hostname -s)" -o 2>/dev/null \
    | grep -Eq 'State=(IDLE|MIXED|ALLOCATED)([+ ]|$)'
}
for _ in $(seq 90); do registered && break; sleep 2; done
registered || fail "slurmd did not register with @@CONTROLLER@@ in 3 minutes (/var/log/slurm/slurmd.log)"
report slurmd ready
report state ready
