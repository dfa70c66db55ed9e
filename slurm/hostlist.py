"""Slurm's compact host lists ('a-[0-2,5],b'), expanded to node names."""

from __future__ import annotations

import re

from mtc.numbers import is_whole_number

HOSTLIST_RE = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")


def expand_hostlist(text: str, limit: int = 256) -> list[str]:
    """Slurm's compact node list -> names: 'a-[0-2,5],b' -> a-0 a-1 a-2 a-5 b."""
    names: list[str] = []
    for match in HOSTLIST_RE.finditer(text or ""):
        prefix, ranges = match.group(1).lstrip(","), match.group(2)
        if not ranges:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not is_whole_number(low) or (high and not is_whole_number(high)):
                return [text]
            for n in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{str(n).zfill(len(low))}")
                if len(names) >= limit:
                    return names
    return names
