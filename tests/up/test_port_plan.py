"""The ports ``autoglm up`` plans, and the hint it gives when one is taken."""

from __future__ import annotations

import re
import socket

import pytest

from autoglm.config import ConfigError
from stack.config import MAX_PORT_BASE, MIN_PORT_BASE, UpConfig
from stack.port_plan import another_port_base, check_ports


@pytest.mark.parametrize("base", [MIN_PORT_BASE, 9400, 45000, 55371, 55372, MAX_PORT_BASE])
def test_the_hinted_port_base_is_one_autoglm_up_accepts(base: int) -> None:
    hinted = another_port_base(base)
    assert hinted != base
    assert UpConfig(port_base=hinted).port_base == hinted


def bound_socket(ports: range) -> socket.socket:
    """A listening socket on the first free port of ``ports``."""
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock
    raise AssertionError(f"no free port in {ports}")


def test_a_taken_port_near_the_top_hints_a_valid_base() -> None:
    """A first port within 10000 of the highest allowed: adding 10000 would be refused."""
    with bound_socket(range(MAX_PORT_BASE - 5000, MAX_PORT_BASE + 1)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} \\(exporter\\)") as refused:
            check_ports(UpConfig(port_base=port), with_prometheus=False)
    hinted = int(re.search(r"--port-base (\d+)", str(refused.value)).group(1))
    assert UpConfig(port_base=hinted).port_base == hinted
