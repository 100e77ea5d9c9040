"""The rendezvous port (``identity.free_port``): free when chosen, and never one of the kernel's
ephemeral ports, which outgoing connections are given. A port from ``bind(0)`` is ephemeral:
between the choice and the rendezvous binding it, another process's connection took it, and a
gloo job failed with EADDRINUSE while several started at once."""

from __future__ import annotations

import socket

from hpctrain.identity import RENDEZVOUS_PORTS, ephemeral_range, free_port


def test_the_port_is_free_and_outside_the_ephemeral_range():
    low, high = ephemeral_range()
    held = []
    try:
        for _ in range(50):
            port = free_port("127.0.0.1")
            assert not low <= port <= high
            assert RENDEZVOUS_PORTS[0] <= port <= RENDEZVOUS_PORTS[1]
            s = socket.socket()
            s.bind(("127.0.0.1", port))       # free: it binds, and stays taken for the next
            held.append(s)
        assert len({s.getsockname()[1] for s in held}) == 50
    finally:
        for s in held:
            s.close()


def test_the_ports_above_the_ephemeral_range_are_used_too():
    # the kernel's range ends 3 below the last port: only those 3 are outside it
    port = free_port("127.0.0.1", ephemeral=(RENDEZVOUS_PORTS[0], 65532), tries=2000)
    assert port in (65533, 65534, 65535)


def test_where_every_port_is_ephemeral_the_kernel_chooses():
    port = free_port("127.0.0.1", ephemeral=(1024, 65535))
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_range_is_read_from_the_kernel_and_a_bad_file_is_linux_s_default(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("40000\t50000\n")
    bad.write_text("nonsense")
    assert ephemeral_range(str(good)) == (40000, 50000)
    assert ephemeral_range(str(bad)) == ephemeral_range(str(tmp_path / "missing")) == \
        (32768, 60999)
