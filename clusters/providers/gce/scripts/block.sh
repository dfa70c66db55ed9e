# --- first of all: only root reaches the metadata server -----------------------------
# The munge key (attributes/mtc-munge-key), the VM's access token and the guest
# attributes mtc reads are all there; a job runs as its owner, so it gets a reset.
# The same rule goes into a unit that runs before the network on every later boot, and
# slurmd is never enabled: it starts only from this script, after the rule.
cat >/usr/local/sbin/mtc-metadata-block <<'BLOCK'
#!/bin/bash
set -euo pipefail
addrs=$(printf '%s\n' @@METADATA_ADDRESS@@ \
  $(getent ahostsv4 @@METADATA_HOST@@ 2>/dev/null | awk '{print $1}') | sort -u)
for addr in $addrs; do
  rule=(OUTPUT -d "$addr/32" -p tcp --dport 80 -m owner ! --uid-owner 0 -j REJECT --reject-with tcp-reset)
  iptables -w -C "${rule[@]}" 2>/dev/null || iptables -w -I "${rule[@]:0:1}" 1 "${rule[@]:1}"
done
if command -v ip6tables >/dev/null; then  # the metadata server's IPv6 address
  rule=(OUTPUT -d fd20:ce::254/128 -p tcp --dport 80 -m owner ! --uid-owner 0 -j REJECT --reject-with tcp-reset)
  ip6tables -w -C "${rule[@]}" 2>/dev/null || ip6tables -w -I "${rule[@]:0:1}" 1 "${rule[@]:1}"
fi
BLOCK
chmod 0755 /usr/local/sbin/mtc-metadata-block
/usr/local/sbin/mtc-metadata-block
cat >/etc/systemd/system/mtc-metadata-block.service <<'UNIT'
[Unit]
Description=mtc: only root reaches the metadata server
DefaultDependencies=no
Before=network-pre.target
Wants=network-pre.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/mtc-metadata-block
RemainAfterExit=yes
[Install]
WantedBy=sysinit.target
UNIT
systemctl enable mtc-metadata-block.service >/dev/null 2>&1 || true
