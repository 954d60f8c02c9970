"""Resident memory, open file descriptors and threads of a process and all its descendants.

Read from ``/proc`` (Linux): ``aserve serve --api-workers N`` runs its HTTP front ends (and
multiprocessing's helpers) as child processes, so a leak in any of them must show up in the
sum. Processes that vanish between listing and reading are skipped, not errors.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class TreeSample:
    rss_bytes: int  # VmRSS summed over the tree
    fds: int  # entries of /proc/<pid>/fd summed over the tree
    threads: int
    procs: int  # the process itself and its live descendants
    fd_kinds: dict[str, int] = field(default_factory=dict)  # socket, pipe, anon_inode, file, ...


def _ppid(stat_text: str) -> int:
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    return int(stat_text[stat_text.rindex(")") + 2 :].split()[1])


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            ppid = _ppid((PROC / entry.name / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone already, or not ours to read
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents before children."""
    tree = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, ()))
    return out


def _status_fields(pid: int) -> tuple[int, int]:
    """(VmRSS bytes, Threads) from /proc/<pid>/status; a zombie has no VmRSS line (0)."""
    rss = threads = 0
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024  # the kernel writes kB
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def fd_kind(link: str) -> str:
    """``socket:[123]`` -> socket, ``anon_inode:[eventfd]`` -> anon_inode:eventfd, a path -> file."""
    if link.startswith("/"):
        return "file"
    kind, _, rest = link.partition(":")
    return f"anon_inode:{rest.strip('[]')}" if kind == "anon_inode" else kind


def _fd_kinds(pid: int) -> Counter[str]:
    kinds: Counter[str] = Counter()
    fd_dir = PROC / str(pid) / "fd"
    for name in os.listdir(fd_dir):
        try:
            kinds[fd_kind(os.readlink(fd_dir / name))] += 1
        except FileNotFoundError:
            continue  # closed while we looked
    return kinds


def sample_tree(pid: int) -> TreeSample | None:
    """The tree's totals now, or None when ``pid`` itself is gone."""
    rss = threads = procs = 0
    kinds: Counter[str] = Counter()
    for p in descendants(pid):
        try:
            r, t = _status_fields(p)
            kinds += _fd_kinds(p)
        except (FileNotFoundError, ProcessLookupError):
            if p == pid:
                return None
            continue
        rss, threads, procs = rss + r, threads + t, procs + 1
    return TreeSample(rss, sum(kinds.values()), threads, procs, dict(sorted(kinds.items())))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used (its own threads, not its children's), or
    None when it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and each live descendant, by pid (read them before and after a
    run: the difference is who did the work, e.g. an engine core and its HTTP front ends)."""
    out = {}
    for p in descendants(pid):
        s = cpu_seconds(p)
        if s is not None:
            out[p] = s
    return out


def host_cpu_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all this host's CPUs since boot, from ``/proc/stat``: busy
    is user, nice, system, irq and softirq; total adds idle, iowait and steal (guest time is
    already inside user and nice). Two readings give the host's busy share between them."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(x) for x in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal
