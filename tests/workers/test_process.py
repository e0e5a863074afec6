"""workers/process.py and workers/launch.py: the device and the process count a worker picks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from runtime.settings import Settings
from tests.workers.conftest import make_cluster
from workers.launch import default_processes
from workers.local import ROOT, LocalCluster
from workers.process import device


def test_device_is_cuda_bf16_when_present_else_cpu_fp32() -> None:
    assert device(Settings(device="cpu")) == ("cpu", torch.float32)
    assert device(Settings(device="cuda")) == ("cuda", torch.bfloat16)
    want = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    assert device(Settings()) == want


def test_one_process_per_gpu_else_per_torch_threads_cores() -> None:
    cores = os.cpu_count() or 1
    assert default_processes(Settings(device="cpu", torch_threads=1)) == (cores, 0)
    assert default_processes(Settings(device="cpu", torch_threads=cores * 2)) == (1, 0)
    if torch.cuda.is_available():
        assert default_processes(Settings()) == (torch.cuda.device_count(), torch.cuda.device_count())


def _two_up(c: LocalCluster, name: str) -> subprocess.Popen[bytes]:
    """`setflow worker --processes 2 --name NAME`, once both its processes beat."""
    launcher = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--processes", "2", "--name", name],
                                env=c.env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (c.dispatcher.routing.alive(f"{name}-0") and c.dispatcher.routing.alive(f"{name}-1")):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            raise AssertionError(f"{name}: the worker processes did not come up")
        time.sleep(0.1)
    return launcher


def test_setflow_worker_starts_processes_and_stops_them_on_sigterm(redis_url: str, tmp_path: Path) -> None:
    c = make_cluster(redis_url, tmp_path, worker_heartbeat_s=5.0)  # keys live 15 s: only a goodbye removes them
    launcher = None
    try:
        launcher = _two_up(c, "box")
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        # gone at once, not when their keys expire
        assert not c.dispatcher.routing.alive("box-0") and not c.dispatcher.routing.alive("box-1")
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
        c.close()


def test_a_worker_process_that_dies_unasked_stops_the_set_which_exits_with_its_code(redis_url: str,
                                                                                     tmp_path: Path) -> None:
    """One of `setflow worker --processes 2` dies (its batch loop died and it exited, or it was
    killed): the launcher stops the other and exits non-zero, so a supervisor (compose's restart
    policy) starts the whole set again instead of it serving at half capacity."""
    c = make_cluster(redis_url, tmp_path, worker_heartbeat_s=5.0)
    launcher = None
    try:
        launcher = _two_up(c, "set")
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
        assert len(children) == 2, children
        os.kill(int(children[0]), signal.SIGKILL)
        assert launcher.wait(timeout=60) != 0
        assert not c.dispatcher.routing.alive("set-1"), "the other one was stopped (its goodbye said)"
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
        c.close()
