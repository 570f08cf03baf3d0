"""A real one-node SLURM cluster for the tests: slurmctld + slurmd from Debian's slurm-wlm.

:func:`slurm_cluster` installs slurm-wlm with apt-get when it is missing (these machines allow it as
root), writes a slurm.conf for this host's CPUs in a temporary folder (auth/none: no munge key to
manage; its own ports, state and logs), starts both daemons in the foreground as child processes,
waits until the node is idle, and stops them at the end. Jobs are submitted with the real ``sbatch``
and the environment it yields (``SLURM_CONF``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from keyshot.infer.common.processes import free_port

DAEMONS = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo")


def ensure_slurm() -> str | None:
    """None when SLURM's commands are there (installed now if need be), else why they are not."""
    if all(shutil.which(d) or Path(f"/usr/sbin/{d}").exists() for d in DAEMONS):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "slurm-wlm is not installed and apt-get cannot install it here (not root, or no apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return f"apt-get could not install slurm-wlm: {' '.join(cmd)}: {proc.stderr.strip()[-300:]}"
    return None


def _conf(root: Path) -> str:
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    mem_mb = max(1024, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024)
    return f"""ClusterName=keyshot-test
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
MinJobAge=600
NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@contextlib.contextmanager
def slurm_cluster(root: Path, timeout_s: float = 60) -> Iterator[dict[str, str]]:
    """Start a one-node cluster in ``root``; yields the environment that points sbatch at it."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    try:
        for daemon in ("slurmctld", "slurmd"):
            exe = shutil.which(daemon) or f"/usr/sbin/{daemon}"
            log = open(root / f"{daemon}.out", "wb")  # noqa: SIM115 (closed with the process)
            procs.append(
                (subprocess.Popen([exe, "-D", "-f", str(conf)], env=env, stdout=log, stderr=log), log)
            )
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            state = out.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the test cluster did not come up (node state {state!r}); see {root}/*.log")
        yield env
    finally:
        for proc, log in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def sbatch(env: dict[str, str], *args: str, cwd: Path) -> str:
    """Submit with the real sbatch; returns the job id."""
    proc = subprocess.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"sbatch {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def wait_for(env: dict[str, str], jobs: list[str], timeout_s: float) -> None:
    """Until none of ``jobs`` (array jobs included) is pending or running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T %r"], env=env, capture_output=True, text=True
        )
        if not out.stdout.strip():
            return
        time.sleep(1.0)
    raise AssertionError(f"jobs {jobs} still queued after {timeout_s} s: {out.stdout}")


def job_state(env: dict[str, str], job: str) -> str:
    """The job's final state as the controller remembers it (accounting is off here)."""
    out = subprocess.run(
        ["scontrol", "show", "job", job, "-o"], env=env, capture_output=True, text=True
    ).stdout
    states = [
        w.split("=", 1)[1] for line in out.splitlines() for w in line.split() if w.startswith("JobState=")
    ]
    return ",".join(states) or "unknown"
