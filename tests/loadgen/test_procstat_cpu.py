"""Per-process CPU time from /proc, against the kernel's own accounting of the same processes."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from loadgen.procstat import cpu_seconds, tree_cpu

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")


def test_a_busy_child_is_charged_and_an_idle_one_is_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nimport sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.2)
        deadline = time.monotonic() + 60
        while (cpu_seconds(busy.pid) or 0) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the busy loop is done (a loaded machine runs it slower)
        tree = tree_cpu(os.getpid())
        assert busy.pid in tree and idle.pid in tree and os.getpid() in tree
        assert tree[busy.pid] >= 0.55  # the kernel's ticks: within one tick of 0.6 s of its own clock
        assert tree[idle.pid] < 0.5
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy_cpu = tree[busy.pid]
    finally:
        for p in (busy, idle):
            p.communicate(b"")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # What the kernel reports for the reaped children agrees with what /proc said of them.
    assert reaped == pytest.approx(busy_cpu + (tree[idle.pid]), abs=0.15)
    assert cpu_seconds(busy.pid) is None  # gone


def test_the_hosts_busy_ticks_count_a_busy_process() -> None:
    """/proc/stat's busy ticks grow at least by what this process burns between two readings."""
    from loadgen.procstat import host_cpu_jiffies

    ticks = os.sysconf("SC_CLK_TCK")
    busy0, total0 = host_cpu_jiffies()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    busy1, total1 = host_cpu_jiffies()
    assert busy1 - busy0 >= 0.2 * ticks  # at least this process's 0.3 s, less a tick's rounding
    assert total1 - total0 >= busy1 - busy0
