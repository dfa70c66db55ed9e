
# --- the controller (also the login node) -------------------------------------------
install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
meta mtc-slurm-conf >/etc/slurm/slurm.conf
meta mtc-gres-conf >/etc/slurm/gres.conf
meta mtc-cgroup-conf >/etc/slurm/cgroup.conf
@@ACCOUNTING@@
systemctl enable --now slurmctld
systemctl restart slurmctld
for _ in $(seq 60); do scontrol ping | grep -q UP && break; sleep 2; done
report slurmctld ready
report state ready
