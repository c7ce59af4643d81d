"""What the container's cgroup says (v1 or v2): its CPU quota, the CPU time it has used,
and how many processes the OOM killer has killed in it. Every reader returns None when the
files are not there (a host process, a kernel without them)."""


def read_first(paths):
    for path in paths:
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            continue
    return None


def cpu_quota():
    """How many CPUs the container's CFS quota allows (cgroup v1 or v2), None if unlimited."""
    quota = read_first(("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))
    period = read_first(("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us"))
    try:
        if quota is not None and period is not None:
            q = int(quota)
            return q / float(int(period)) if q > 0 else None
        v2 = read_first(("/sys/fs/cgroup/cpu.max",))
        if v2 is not None:
            q2, p2 = v2.split()[:2]
            return None if q2 == "max" else int(q2) / float(int(p2))
    except ValueError:
        pass
    return None


def cpu_used():
    """CPU seconds the container has used so far (cgroup v1 or v2), or None."""
    v1 = read_first(("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"))
    try:
        if v1 is not None:
            return int(v1) / 1e9
        v2 = read_first(("/sys/fs/cgroup/cpu.stat",))
        if v2 is not None:
            for line in v2.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    except ValueError:
        pass
    return None


def oom_kills():
    for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None
