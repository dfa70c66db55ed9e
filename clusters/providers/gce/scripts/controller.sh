
# --- the controller (also the login node) -------------------------------------------
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
meta mtc-slurm-conf >/etc/slurm/slurm.conf
meta mtc-gres-conf >/etc/slurm/gres.conf
meta mtc-cgroup-conf >/etc/slurm/cgroup.conf
@@ACCOUNTING@@
# Restarted by systemd if it dies: mtc's polls and every node depend on it.
mkdir -p /etc/systemd/system/slurmctld.service.d
printf '[Service]\nRestart=always\nRestartSec=5\n' >/etc/systemd/system/slurmctld.service.d/mtc.conf
systemctl daemon-reload
systemctl enable --now slurmctld
systemctl restart slurmctld
for _ in $(seq 60); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 2; done
scontrol ping 2>/dev/null | grep -q UP || fail "slurmctld is not UP after 2 minutes (/var/log/slurm/slurmctld.log)"
report slurmctld ready
report state ready
