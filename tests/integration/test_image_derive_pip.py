"""`train image new` with the pip that a fresh venv brings (ensurepip's own: 23.0.1 on
Python 3.10.13, 23.2.1 on 3.11.7 and 3.12.1, versions whose `pip install` took
--python-version/--platform only with --target), offline: the resolution reads a folder of
wheels the test writes (and the stack test's tabulate wheel where TRAIN_TEST_STACK_WHEELS
has it). The fresh venv reaches train and its dependencies through a .pth file that adds the
test's own site-packages after its own, so its pip is the one that runs."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_image_derive import make_wheel
from train.images.derive import read_lock

pytestmark = pytest.mark.slow


def _fresh_venv(root: Path) -> Path:
    """A venv made as a user makes one (python -m venv: ensurepip's bundled pip, offline);
    returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300,
                   capture_output=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], check=True,
                             timeout=60, capture_output=True, text=True).stdout.strip()
    ours = [*site.getsitepackages(), site.getusersitepackages()]
    (Path(purelib) / "zz_train_test.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours if Path(p).is_dir()),
        encoding="utf-8")
    return python


def _env() -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in drop}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def test_image_new_resolves_with_the_pip_a_fresh_venv_brings(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")
    pip = subprocess.run([str(python), "-c", "import pip, sys, train; "
                          "print(pip.__version__, pip.__file__, sys.version_info[:2])"],
                         check=True, timeout=60, capture_output=True, text=True,
                         env=_env()).stdout
    assert str(tmp_path / "venv") in pip, pip  # the fresh venv's own pip runs
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "extra-pkg", "1.2.0", ("helper-pkg>=0.2",))
    make_wheel(wheels, "helper-pkg", "0.3")
    wanted = {"extra-pkg": "1.2.0", "helper-pkg": "0.3"}
    stack = os.environ.get("TRAIN_TEST_STACK_WHEELS")
    for wheel in sorted(Path(stack).glob("tabulate-0.9.0-*.whl")) if stack else []:
        (wheels / wheel.name).write_bytes(wheel.read_bytes())
        wanted["tabulate"] = "0.9.0"
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(f"{n}=={v}\n" for n, v in wanted.items()),
                            encoding="utf-8")
    proc = subprocess.run([str(python), "-m", "train", "image", "new", "mine",
                           "--requirements", str(requirements), "--find-links", str(wheels),
                           "--out", str(tmp_path / "containers-mine")],
                          timeout=600, capture_output=True, text=True, env=_env(),
                          cwd=tmp_path, check=False)
    assert proc.returncode == 0, f"pip {pip}: {proc.stderr[-2000:]}"
    lock = read_lock(tmp_path / "containers-mine" / "requirements" / "mine.txt")
    assert {name: pin.version for name, pin in lock.items()} == wanted, pip
