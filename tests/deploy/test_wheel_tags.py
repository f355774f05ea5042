"""The glibc floor the bundle's README states: the newest glibc any wheel's platform tag needs."""

from __future__ import annotations

from ortserve.deploy.bundle import glibc_floor


def test_the_newest_manylinux_tag_sets_the_floor():
    names = [
        "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "ortserve-0.1.0-cp311-cp311-manylinux_2_36_x86_64.whl",
        "msgspec-0.19.0-cp311-cp311-manylinux2014_x86_64.whl",
        "jinja2-3.1.6-py3-none-any.whl",
    ]
    assert glibc_floor(names) == ((2, 36), names[1])
    assert glibc_floor(names[2:]) == ((2, 17), names[2])  # manylinux2014 is glibc 2.17
    assert glibc_floor(["old-1.0-cp311-cp311-manylinux1_x86_64.whl"])[0] == (2, 5)


def test_pure_python_wheels_set_no_floor():
    assert glibc_floor(["jinja2-3.1.6-py3-none-any.whl"]) is None
