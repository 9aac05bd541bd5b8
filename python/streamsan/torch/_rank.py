"""Which rank of a distributed run this process is: each rank's check is its own.

Under `torchrun` (or any launcher that sets the same environment: RANK, WORLD_SIZE, LOCAL_RANK)
every process checks its own streams, so each writes its own report and trace. A path given for
one is made per rank: `{rank}` in it is replaced by the rank, or else `.rankN` goes before its
extension (`run.jsonl` -> `run.rank3.jsonl`). A single process (no such environment, or a world
of one) keeps the paths it was given.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, NamedTuple, Optional


class Rank(NamedTuple):
    """This process's place in a distributed run of more than one process."""

    rank: int
    world_size: int
    local_rank: Optional[int] = None

    def __str__(self) -> str:
        s = f"rank {self.rank} of {self.world_size}"
        if self.local_rank is not None and self.local_rank != self.rank:
            s += f" (local rank {self.local_rank})"
        return s


def _int(env: Mapping[str, str], key: str) -> Optional[int]:
    v = env.get(key)
    if v is None:
        return None
    try:
        return int(v.strip())
    except ValueError:
        return None


def current(env: Optional[Mapping[str, str]] = None) -> Optional[Rank]:
    """This process's rank: from RANK and WORLD_SIZE (torchrun sets them, and LOCAL_RANK), else
    from an initialized default process group of torch.distributed; None for a single process."""
    env = os.environ if env is None else env
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE") if rank is not None else None  # (decides nothing without RANK)
    if rank is None or world is None:
        rank = world = None
        dist = sys.modules.get("torch.distributed")  # never imported here for this
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        except Exception:
            rank = world = None
    if rank is None or world is None or world <= 1 or rank < 0:
        return None
    return Rank(rank, world, _int(env, "LOCAL_RANK"))


def path_for(path: str, rank: Optional[Rank]) -> str:
    """`path` for this rank: `{rank}` replaced by the rank (0 for a single process), or else
    `.rankN` inserted before the extension when there are several ranks."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank.rank if rank is not None else 0))
    if rank is None:
        return path
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    if not stem:
        stem, ext = ext, ""
    return os.path.join(head, f"{stem}.rank{rank.rank}{ext}")
