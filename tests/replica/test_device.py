"""Which GPU a replica's model lives on, and the one-line error when there is none for it."""

from __future__ import annotations

import pytest
import torch

from hogwild.errors import ConfigError
from hogwild.replica.build import replica_device


def test_cpu_runs_need_no_gpu() -> None:
    assert replica_device("cpu", 3) == torch.device("cpu")


def test_cuda_without_a_gpu_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device: cuda requested"):
        replica_device("cuda", 0)


def test_more_local_replicas_than_gpus_fails_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun --nproc-per-node=2 on a one-GPU machine: LOCAL_RANK 1 has no GPU of its own, and
    # NCCL refuses two ranks on one GPU; say so instead of a CUDA traceback.
    made_current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    with pytest.raises(ConfigError, match=r"^device: cuda for LOCAL_RANK 1, but this machine shows 1 GPU"):
        replica_device("cuda", 1)
    assert made_current == []


def test_each_local_rank_gets_its_own_gpu_made_current(monkeypatch: pytest.MonkeyPatch) -> None:
    made_current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    assert replica_device("cuda", 2) == torch.device("cuda", 2)
    assert made_current == [2]
