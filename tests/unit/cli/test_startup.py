"""Data directory lock, listen errors and the kubeconfig's lifecycle."""

from __future__ import annotations

import os
import socket
import stat

import pytest
import yaml

from kubeplane.apiserver.app import APIServer, APIServerConfig
from kubeplane.startup import DataDirLock, KubeconfigFile, StartupError, bind_socket, prepare_data_dir


def test_data_dir_is_private(tmp_path):
    d = tmp_path / "a" / "b"
    prepare_data_dir(str(d))
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_second_lock_is_refused_with_the_holders_pid(tmp_path):
    first = DataDirLock(str(tmp_path / "data"))
    first.acquire()
    # flock locks belong to open files: a second open conflicts even in this process.
    with pytest.raises(StartupError, match=rf"data directory .*data is in use by another kubeplane process "
                                           rf"\(pid {os.getpid()}\)"):
        DataDirLock(str(tmp_path / "data")).acquire()
    first.release()
    second = DataDirLock(str(tmp_path / "data"))
    second.acquire()  # free again once released
    second.release()


def test_busy_port_is_one_line():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(StartupError) as err:
            bind_socket("127.0.0.1", port)
        assert str(err.value) == f"listen tcp 127.0.0.1:{port}: bind: address already in use"
    finally:
        holder.close()


async def test_api_server_on_a_locked_dir_refuses_and_leaves_the_first_alone(tmp_path):
    kc_a, kc_b = tmp_path / "kc-a", tmp_path / "kc-b"
    a = APIServer(APIServerConfig(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", kubeconfig=str(kc_a)))
    await a.start()
    try:
        db = tmp_path / "d" / "kubeplane.db"
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o700
        assert stat.S_IMODE(kc_a.stat().st_mode) == 0o600
        b = APIServer(APIServerConfig(data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", kubeconfig=str(kc_b)))
        with pytest.raises(StartupError, match="in use by another kubeplane process"):
            await b.start()
        assert not kc_b.exists()
        assert yaml.safe_load(kc_a.read_text())["clusters"][0]["cluster"]["server"] == a.url
    finally:
        await a.stop()
    assert not kc_a.exists()  # withdrawn on stop


def test_kubeconfig_is_withdrawn_only_while_ours(tmp_path):
    path = tmp_path / "kubeconfig"
    kc = KubeconfigFile(str(path))
    kc.publish("http://127.0.0.1:1234")
    assert yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:1234"
    kc.withdraw()
    assert not path.exists()
    kc.publish("http://127.0.0.1:1234")
    other = KubeconfigFile(str(path))
    other.publish("http://127.0.0.1:5678")  # another process replaced it
    kc.withdraw()
    assert yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:5678"


def test_stale_kubeconfig_is_removed_but_not_a_users_own(tmp_path):
    path = tmp_path / "kubeconfig"
    KubeconfigFile(str(path)).publish("http://127.0.0.1:1")
    KubeconfigFile(str(path)).remove_stale()
    assert not path.exists()
    mine = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
            "clusters": [{"name": "prod", "cluster": {"server": "https://prod"}}],
            "users": [{"name": "prod", "user": {"token": "t"}}],
            "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod"}}]}
    path.write_text(yaml.safe_dump(mine))
    KubeconfigFile(str(path)).remove_stale()
    assert yaml.safe_load(path.read_text()) == mine
