
# --- a compute node: configless slurmd that registers itself (dynamic node) ----------
install -d /var/spool/slurmd /var/log/slurm /etc/slurm
meta mtc-prolog >/etc/slurm/mtc-prolog.sh
meta mtc-epilog >/etc/slurm/mtc-epilog.sh
chmod 0755 /etc/slurm/mtc-prolog.sh /etc/slurm/mtc-epilog.sh
# A drop-in, because systemd does not honour quotes inside an EnvironmentFile variable.
mkdir -p /etc/systemd/system/slurmd.service.d
cat >/etc/systemd/system/slurmd.service.d/mtc.conf <<CONF
[Service]
ExecStart=
ExecStart=$(command -v slurmd) -D -s -Z --conf-server @@CONTROLLER@@ --conf "Feature=@@POOL@@@@GRES@@"
CONF
systemctl daemon-reload
# Not enabled: at boot slurmd waits for this script (the metadata rule, the accounts).
systemctl disable slurmd >/dev/null 2>&1 || true
systemctl restart slurmd
for _ in $(seq 90); do
  state=$(scontrol show node "$(hostname -s)" -o 2>/dev/null | grep -o 'State=[A-Z+_]*' || true)
  case "$state" in State=IDLE*|State=MIXED*|State=ALLOCATED*) break ;; esac
  sleep 2
done
report slurmd ready
report state ready
