"""Which GPUs a torch build can run on: its architecture list against each GPU's compute
capability (the rule `train launch` and `train run --device` apply before training)."""

from __future__ import annotations

import dataclasses

import pytest

from train.common.cuda_check import CudaFacts, check, unserved_gpus
from train.common.gpus import arch_runs, parse_arch

# torch.cuda.get_arch_list() of PyPI's torch 2.13.0 (CUDA 13.0) and of 2.10.0 (CUDA 12.8),
# as the two builds report them (issue 20's reading of the wheels)
CU130 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
CU128 = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")

OK = CudaFacts(torch_version="2.13.0", torch_cuda="13.0", torch_available=True,
               torch_devices=1, visible_devices="0", driver_cuda=13000,
               driver_version="580.65.06", nvml_gpus=1, arch_list=CU130,
               gpus=(("NVIDIA A100-SXM4-80GB", (8, 0)),))


@pytest.mark.parametrize(("entry", "parsed"), [
    ("sm_86", ("sm", (8, 6), "")),
    ("sm_100", ("sm", (10, 0), "")),
    ("sm_121", ("sm", (12, 1), "")),
    ("compute_90", ("compute", (9, 0), "")),
    ("sm_90a", ("sm", (9, 0), "a")),
    ("SM_70 ", ("sm", (7, 0), "")),
    ("gfx90a", None),
    ("sm_", None),
])
def test_parse_arch(entry: str, parsed: object) -> None:
    assert parse_arch(entry) == parsed


@pytest.mark.parametrize(("cap", "arch", "runs"), [
    ((7, 0), CU130, False),  # a V100 on the CUDA 13 build: no sm_70
    ((7, 0), CU128, True),
    ((7, 5), CU130, True),   # T4, RTX 2080
    ((8, 6), ("sm_80",), True),  # same major, higher minor
    ((8, 0), ("sm_86",), False),  # same major, lower minor
    ((9, 0), ("sm_80", "sm_86"), False),  # machine code never runs on another major
    ((8, 9), CU130, True),   # L40S by sm_86
    ((9, 0), ("sm_90a",), True),
    ((9, 0), ("sm_80", "compute_80"), True),  # PTX is compiled for newer GPUs
    ((7, 0), ("compute_80",), False),  # but never for older ones
    ((10, 3), ("sm_90a",), False),
    ((12, 1), CU130, True),
])
def test_arch_runs(cap: tuple[int, int], arch: tuple[str, ...], runs: bool) -> None:
    assert arch_runs(cap, arch) is runs


def test_a_v100_on_the_cuda13_image_stops_before_training_with_the_variant() -> None:
    v100 = dataclasses.replace(OK, gpus=(("Tesla V100-SXM2-32GB", (7, 0)),))
    message = check(v100)
    assert message is not None and message.startswith("CUDA is unusable: ")
    assert "Tesla V100-SXM2-32GB (sm_70)" in message
    assert " ".join(CU130) in message  # what the image carries
    assert "no kernel image is available" in message
    assert "BASE_LOCK=base-cu128.txt" in message  # the variant to use
    assert "--device cpu" in message


def test_the_cu128_variant_serves_the_v100_and_mixed_nodes_name_only_the_unserved() -> None:
    v100 = (("Tesla V100-SXM2-32GB", (7, 0)),)
    assert check(dataclasses.replace(OK, torch_cuda="12.8", driver_cuda=12020,
                                     arch_list=CU128, gpus=v100)) is None
    mixed = dataclasses.replace(OK, torch_devices=2, visible_devices="0,1", nvml_gpus=2,
                                gpus=(*v100, ("NVIDIA A100", (8, 0))))
    assert unserved_gpus(mixed) == list(v100)
    message = check(mixed)
    assert message is not None and "A100" not in message


def test_unknown_architectures_are_not_a_failure() -> None:
    """Where torch could not say (no list, no GPUs read), the rule has nothing to compare."""
    assert check(dataclasses.replace(OK, arch_list=None)) is None
    assert check(dataclasses.replace(OK, gpus=None)) is None
    assert check(OK) is None


# -- reading a build's architectures from its binaries ----------------------------------

def _elf_with_fatbin(entries: list[tuple[int, int]], containers: int = 2) -> bytes:
    """A minimal 64-bit ELF whose .nv_fatbin holds `containers` fat binaries of `entries`
    (kind, SM), each entry with a small payload, the layout nvcc writes."""
    import struct

    from train.images.arch import FATBIN_MAGIC

    fatbin = b""
    for _ in range(containers):
        body = b""
        for kind, sm in entries:
            payload = b"\xab" * 24
            header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload))
            header += struct.pack("<IIHHI", 0, 0, 7, 1, sm).ljust(64 - 16, b"\0")
            body += header + payload
        fatbin += struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
        fatbin += b"\0" * (-len(fatbin) % 8) + b"\0" * 8  # padding between containers
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_off = 64
    names_off = data_off + len(fatbin)
    shoff = names_off + len(names)
    shoff += -shoff % 8

    def section(name: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, offset, size, 0, 0, 8, 0)

    ehdr = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    ehdr += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)
    body = ehdr + fatbin + names
    body += b"\0" * (shoff - len(body))
    return body + section(0, 0, 0) + section(1, names_off, len(names)) + \
        section(11, data_off, len(fatbin))


def test_the_fatbin_reader_finds_every_container_and_entry_kind() -> None:
    from train.images.arch import KIND_ELF, KIND_PTX, library_arch

    data = _elf_with_fatbin([(KIND_ELF, 70), (KIND_ELF, 80), (KIND_PTX, 90), (KIND_ELF, 121)])
    build = library_arch(data, "12.8")
    assert build.sm == (70, 80, 121) and build.ptx == (90,)
    assert build.arch_list == ("sm_70", "sm_80", "sm_121", "compute_90")


def test_a_library_without_fatbins_is_a_cpu_build_and_garbage_is_refused() -> None:
    from train.images.arch import library_arch

    empty = _elf_with_fatbin([], containers=0)
    assert library_arch(empty, None).arch_list == ()
    with pytest.raises(ValueError, match="ELF"):
        library_arch(b"MZ not an elf", None)


def test_a_wheel_is_read_without_torch(tmp_path: pytest.TempPathFactory) -> None:
    import zipfile
    from pathlib import Path

    from train.images.arch import KIND_ELF, wheel_arch

    wheel = Path(str(tmp_path)) / "torch-0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("torch/version.py", "__version__ = '9.9.9'\ncuda: Optional[str] = "
                                             "'12.8'\n")
        archive.writestr("torch/lib/libtorch_cuda.so", _elf_with_fatbin([(KIND_ELF, 70)]))
    assert wheel_arch(wheel).cuda == "12.8"
    assert wheel_arch(wheel).sm == (70,)


def test_lock_headers_round_trip_and_every_shipped_gpu_is_served() -> None:
    """Every GPU type of every shipped profile runs on at least one shipped base variant
    (the lock headers, read from the wheels): a lock set that leaves a partition without a
    variant fails here."""
    from pathlib import Path

    from train.client.clusters.profiles import Registry
    from train.common.cuda_check import VARIANTS
    from train.common.gpus import capability
    from train.images.arch import BuildArch, read_header

    build = BuildArch("12.8", (70, 80), (90,))
    assert read_header(build.header("x.whl")) == build
    with_linalg = BuildArch("13.0", (75, 80), (), ("sm_80",))
    assert read_header(with_linalg.header("x.whl")) == with_linalg
    assert read_header("numpy==1\n") is None
    locks = Path(__file__).parents[2] / "containers" / "requirements"
    served = {lock: read_header((locks / lock).read_text()) for lock in VARIANTS}
    assert all(served.values()), served
    registry = Registry(environ={})
    missing = []
    for name in registry.names():
        profile = registry.get(name)
        for node in (*profile.partitions.values(), *profile.constraints.values()):
            for gpu in node.gpu_types:
                cap = capability(gpu)
                assert cap is not None, (name, gpu)
                if not any(b is not None and arch_runs(cap, b.arch_list)
                           and arch_runs(cap, b.linalg or b.arch_list)
                           for b in served.values()):
                    missing.append((name, node.name, gpu))
    assert not missing, missing


def test_real_cuda_wheels_are_read_as_their_release_notes_say() -> None:
    """PyPI's torchvision 0.25.0 (with torch 2.10, CUDA 12.8) carries sm_70 for the V100;
    0.28.0 (with torch 2.13, CUDA 13.0) starts at sm_75. `nox -s tests` downloads both
    (TRAIN_TEST_ARCH_WHEELS); CI must have them."""
    import os
    from pathlib import Path

    from train.images.arch import wheel_arch

    folder = os.environ.get("TRAIN_TEST_ARCH_WHEELS")
    if not folder or not list(Path(folder).glob("torchvision-*.whl")):
        if os.environ.get("CI"):
            pytest.fail("TRAIN_TEST_ARCH_WHEELS holds no torchvision wheels in CI")
        pytest.skip("no real CUDA wheels here: run through `nox -s tests`")
    builds = {w.name.split("-")[1]: wheel_arch(w) for w in Path(folder).glob("torchvision-*.whl")}
    cu128, cu130 = builds["0.25.0"], builds["0.28.0"]
    assert cu128.cuda == "12.8" and cu130.cuda == "13.0"
    assert 70 in cu128.sm and 70 not in cu130.sm and 75 in cu130.sm
    assert arch_runs((7, 0), cu128.arch_list) and not arch_runs((7, 0), cu130.arch_list)
    assert set(cu128.sm) >= {70, 75, 80, 86, 90, 100, 120}
