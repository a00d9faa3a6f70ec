"""The jobs of a SLURM sweep watched by squeue: submitit's job watcher asks ``sacct`` for their states, which a
cluster without accounting cannot answer (submitit then warns every few seconds, and waits forever for a job that
ended without writing its result). QueueWatcher reads squeue there, and says each pending job's reason once.
"""

from __future__ import annotations

import logging
import subprocess
import time

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from minillm.training.run.slurm import run_tool

log = logging.getLogger("minillm")

# squeue's reasons a pending job gives, said once each; the others are said as squeue words them
REASONS = {
    "Resources": "waiting for the CPUs, GPUs or memory it asks to free up",
    "Priority": "jobs of higher priority go first",
    "JobArrayTaskLimit": "the sweep's other jobs hold the array's limit of jobs at once",
    "BeginTime": "requeued or deferred: SLURM starts it shortly",
    "PartitionConfig": "it asks more than the partition gives; it will not start (scancel it and ask less)",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved",
}
ACTIVE = {"CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED",
          "RESV_DEL_HOLD", "SPECIAL_EXIT"}  # not ended, though submitit's list of unfinished states lacks them


class QueueWatcher(SlurmInfoWatcher):
    """submitit's watcher of the sweep's jobs; without accounting (sacct answers nothing) it reads squeue, where a job
    that has left the queue has ended. Either way each new pending reason of a job is said once."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s=delay_s)
        self._accounting: bool | None = None
        self._said: set[tuple[str, str]] = set()

    def update(self) -> None:
        active = sorted({x.split("_")[0] for x in self._registered - self._finished})
        if not active:
            return
        queue = self._queue(active)
        if self._accounting is None:
            self._accounting = run_tool("sacct", "-n", "-X", "-j", active[0]) is not None
            if not self._accounting:
                log.info("sacct answers nothing on this cluster (no accounting): the jobs' states come from squeue")
        if self._accounting:
            super().update()
            return
        self._num_calls += 1
        if queue is not None:
            for job in self._registered - self._finished - set(queue):
                queue[job] = {"JobID": job, "State": "ENDED", "Reason": "left the queue"}
            self._info_dict.update(queue)
        self._last_status_check = time.time()
        for job in self._registered - self._finished:
            if self.is_done(job, mode="cache"):
                self._finished.add(job)

    def _queue(self, ids: list[str]) -> dict[str, dict[str, str]] | None:
        """squeue's state and reason of each task of the jobs (one line per array task); says each new reason."""
        try:
            out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%r", "-j", ",".join(ids)],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode and "Invalid job id" not in out.stderr:
            return None
        info = self.read_info("JobID|State|NodeList|Reason\n" + out.stdout)
        pending: dict[str, list[str]] = {}
        for job, stats in info.items():
            if stats.get("State") in ACTIVE:
                stats["State"] = "RUNNING"
            reason = stats.get("Reason", "")
            if stats.get("State") == "PENDING" and reason not in ("", "None") and (job, reason) not in self._said:
                self._said.add((job, reason))
                pending.setdefault(reason, []).append(job)
        for reason, jobs in pending.items():
            log.warning(f"SLURM job{'s' if len(jobs) > 1 else ''} {', '.join(sorted(jobs))} pending ({reason}): "
                        f"{REASONS.get(reason, 'as squeue says')}")
        return info


def install_watcher() -> None:
    """submitit's SLURM jobs report through a QueueWatcher from now on (in this process: the sweep's submitter)."""
    if not isinstance(SlurmJob.watcher, QueueWatcher):
        SlurmJob.watcher = QueueWatcher(delay_s=60)
