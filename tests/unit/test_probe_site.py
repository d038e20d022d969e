"""`train clusters probe` against stand-in site commands (small scripts first on PATH): what
it reads (MaxArraySize), where --write writes (the profile's own file, every earlier one kept
as a numbered copy), and its error paths: a command that hangs, floods stderr, prints
terminal escapes or fails, and a --write that fails, each with the whole report shown."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli
from train.client.clusters.probe import site as probe_site
from train.client.clusters.probe import write
from train.client.clusters.profiles import Registry
from train.common.errors import ConfigError

# the shipped profile `local` as the site says it, but for MaxArraySize
SINFO_LOCAL = "debug|n1|4|8000|gpu:2|(null)|1:00:00|1-infinite|debug*\n" \
              "debug|n2|4|8000|gpu:2|(null)|1:00:00|1-infinite|debug*\n"
CONFIG = "SLURM_VERSION = 24.05.1\nKillWait = 30 sec\nMaxArraySize = 5000\n"
ESC = "\x1b"

# a user's own profile: its comments and a partition sinfo does not list exist only here
MINE = """\
# my notes on this site: the 'old' partition is reserved for course work
name: local
extends: local
partitions:
  debug:
    gpus_per_node: 8
    cpus_per_node: 4
    mem_per_node: 8000M
    max_time: "2:00:00"
  old:
    gpus_per_node: 0
    cpus_per_node: 4
    mem_per_node: 8G
    max_time: "1:00:00"
"""


def _script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _site(tmp_path: Path, **bodies: str) -> dict[str, str]:
    """An environment whose PATH starts with stand-ins for the site's commands (a body
    given replaces the default one) and whose HOME is under tmp_path."""
    folder = tmp_path / "bin"
    folder.mkdir()
    defaults = {"sinfo": f"printf '%s' '{SINFO_LOCAL}'\n",
                "scontrol": f"printf '%s' '{CONFIG}'\n",
                "sacctmgr": "echo 'sacctmgr: error: no accounting storage' >&2; exit 1\n",
                "apptainer": "echo 'apptainer version 1.3.4'\n"}
    for name, body in {**defaults, **bodies}.items():
        _script(folder, name, body)
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "PATH": f"{folder}:/usr/bin:/bin", "USER": "someone"}


def _user_dir(env: dict[str, str]) -> Path:
    folder = Path(env["HOME"]) / ".config" / "train" / "clusters"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_a_second_write_keeps_the_users_own_file_and_names_each_copy(tmp_path: Path) -> None:
    env = _site(tmp_path)
    mine = _user_dir(env) / "local.yaml"
    mine.write_text(MINE)
    first = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"wrote {mine} (the earlier file is kept as {mine}.1)" in first.stdout, first.stdout
    written = mine.read_text()
    # the same site again: the file holds these values already, and no copy of an
    # identical profile is made (one was, at every --write)
    second = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"{mine} holds these values already: left as it was" in second.stdout, \
        second.stdout
    assert mine.read_text() == written and not Path(f"{mine}.2").exists()
    # the hand-written file, its comment and its partition, is still there, as it was
    assert Path(f"{mine}.1").read_text() == MINE
    assert "old" not in yaml.safe_load(mine.read_text())["partitions"]
    # another value: written, and the earlier file kept as the next copy
    assert "gpus_per_node: 2  #" in written
    mine.write_text(written.replace("gpus_per_node: 2  #", "gpus_per_node: 8  #", 1))
    third = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert f"(the earlier file is kept as {mine}.2)" in third.stdout, third.stdout


def test_a_kept_copy_already_there_is_never_replaced(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "profiles"
    folder.mkdir()
    path = folder / "local.yaml"
    path.write_text(MINE)
    Path(f"{path}.1").write_text("an older copy\n")
    prof = Registry([path], environ={}).get("local")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SINFO_LOCAL))
    kept = write.write_profile(prof, site, path)
    assert kept == Path(f"{path}.2") and kept.read_text() == MINE
    assert Path(f"{path}.1").read_text() == "an older copy\n"


@pytest.mark.parametrize("where", ["--profile", "TRAIN_CLUSTERS_PATH"])
def test_write_writes_where_the_profile_came_from(tmp_path: Path, where: str) -> None:
    env = _site(tmp_path)
    folder = tmp_path / "site-profiles"
    folder.mkdir()
    mine = folder / "mine.yaml"
    mine.write_text(MINE.replace("name: local", "name: mine"))
    args = ["clusters", "probe", "mine", "--write"]
    if where == "--profile":
        args += ["--profile", str(mine)]
    else:
        env["TRAIN_CLUSTERS_PATH"] = str(folder)
    proc = run_cli(args, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert f"wrote {mine} (the earlier file is kept as {mine}.1)" in proc.stdout, proc.stdout
    assert "the profile mine now says what the site says" in proc.stdout, proc.stdout
    data = yaml.safe_load(mine.read_text())
    assert (data["name"], data["extends"]) == ("mine", "local")
    assert data["partitions"]["debug"]["gpus_per_node"] == 2
    assert not (Path(env["HOME"]) / ".config").exists()  # nothing written anywhere else
    again = run_cli(args[:3] + args[4:], env=env, cwd=tmp_path)
    assert "differences: none" in again.stdout, again.stdout


def test_max_array_size_is_read_compared_and_written(tmp_path: Path) -> None:
    assert probe_site.parse_array_size(CONFIG) == 5000
    assert probe_site.parse_array_size("KillWait = 30 sec\n") is None
    with pytest.raises(ValueError, match="MaxArraySize"):
        probe_site.parse_array_size("MaxArraySize = lots\n")
    env = _site(tmp_path)
    proc = run_cli(["clusters", "probe", "local"], env=env, cwd=tmp_path)
    assert "max_array_size: profile says 1001, the site says 5000 (MaxArraySize)" \
        in proc.stdout, proc.stdout
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (_user_dir(env) / "local.yaml").read_text()
    assert yaml.safe_load(text)["max_array_size"] == 5000
    assert "scontrol show config (MaxArraySize)" in text
    assert "now says what the site says" in proc.stdout, proc.stdout


def test_a_max_array_size_slurm_would_not_print_is_named_not_written(tmp_path: Path) -> None:
    env = _site(tmp_path, scontrol="echo 'MaxArraySize = 99999999999'\n")
    proc = run_cli(["clusters", "probe", "local"], env=env, cwd=tmp_path)
    assert "  job array size: `scontrol show config` printed what the probe cannot read: " \
           "MaxArraySize = '99999999999' is not a number from 0 to 4000001" in proc.stdout, \
        proc.stdout


def test_a_hung_command_is_killed_with_its_children_and_said(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # sinfo starts a child and a shell with a child of its own, all of which would outlive
    # it, writes their ids, then waits on them
    env = _site(tmp_path, sinfo=f"sleep 600 & echo $! >> {pids}\n"
                               f"sh -c 'sleep 600 & echo $! >> {pids}; echo $$ >> {pids}; "
                               "wait' &\n"
                               f"echo $$ >> {pids}\nwait\n")
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if len(notes) == 1:  # said while it runs: wait for all four to have started
            _written(pids, 4)

    site = probe_site.read_site(env, timeout=1, note=note)
    assert site.nodes == []
    shown = "`sinfo -h -N -o '%R|%N|%c|%m|%G|%f|%l|%s|%P'`"
    assert f"partitions and nodes: {shown} did not answer in 1 s (killed, with its " \
           "children)" in site.unread, site.unread
    assert notes == [f"{shown} has not answered in 0.5 s; waiting at most 1 s",
                     f"{shown} did not answer in 1 s: killed it and its children"], notes
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 4, started  # sinfo, its sleep, the sh and its sleep
    assert _running(started) == [], _running(started)


def _written(path: Path, count: int) -> None:
    """Until `path` holds `count` lines (a bounded number of looks)."""
    import time

    for _ in range(3000):
        if path.exists() and len(path.read_text().split()) >= count:
            return
        time.sleep(0.01)


def _running(pids: list[int]) -> list[int]:
    """Those of pids that are still processes, not zombies (SIGKILL is sent; the kernel
    ends each one on its own time: look until they are gone, a bounded number of times)."""
    import time

    for _ in range(500):
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue
            if state not in ("Z", "X"):
                alive.append(pid)
        if not alive:
            return []
        time.sleep(0.02)
    return alive


def test_the_cli_bound_is_a_flag_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    env = _site(tmp_path, sinfo="sleep 600\n")
    proc = run_cli(["clusters", "probe", "local", "--timeout", "1"], env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert "did not answer in 1 s: killed it and its children" in proc.stderr, proc.stderr
    assert "did not answer in 1 s (killed, with its children)" in proc.stdout, proc.stdout
    for bad in ("0", "-3", "nan", "601"):
        proc = run_cli(["clusters", "probe", "local", "--timeout", bad], env=env, cwd=tmp_path)
        assert proc.returncode == 2 and "--timeout: seconds above 0, at most 600" \
            in proc.stderr, (bad, proc.stderr)
        assert proc.stdout == ""
    proc = run_cli(["clusters", "show", "local", "--timeout", "5"], env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "--timeout: only with" in proc.stderr, proc.stderr
    from train.cli.clusters import PROBE_TIMEOUT

    assert probe_site.TIMEOUT == PROBE_TIMEOUT  # the help's default is the probe's


def test_a_program_that_hung_is_not_asked_again(tmp_path: Path) -> None:
    """sacctmgr's QOS query hangs: its associations query (the same daemon) is not made,
    so a dead accounting daemon costs one bound, not two."""
    asked = tmp_path / "asked"
    env = _site(tmp_path, sacctmgr=f"echo \"$*\" >> {asked}\nsleep 600\n")
    site = probe_site.read_site(env, timeout=1, note=lambda _: None)
    said = asked.read_text() if asked.exists() else ""  # (killed before its echo: none)
    assert "associations" not in said and len(said.splitlines()) <= 1, said
    assert "your associations (accounts): not asked (sacctmgr did not answer just before)" \
        in site.unread, site.unread
    assert site.nodes and site.apptainer == "apptainer version 1.3.4"  # the others answer


def test_megabytes_of_stderr_become_a_short_tail_on_one_line(tmp_path: Path) -> None:
    env = _site(tmp_path, sacctmgr="i=0\nwhile [ $i -lt 40000 ]; do\n"
                "  echo 'sacctmgr: error: a very long complaint about the database' >&2\n"
                "  i=$((i+1))\ndone\necho 'sacctmgr: error: last words' >&2\nexit 1\n")
    proc = run_cli(["clusters", "probe", "local"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    qos = next(line.strip() for line in proc.stdout.splitlines() if "QOS limits:" in line)
    assert qos.startswith("QOS limits: `sacctmgr -n -P show qos format=Name,MaxWall` failed "
                          "(exit status 1): ..."), qos
    assert qos.endswith("sacctmgr: error: last words") and "\n" not in qos, qos
    assert len(qos) < 450, len(qos)


def test_terminal_escapes_from_the_site_are_neither_printed_nor_written(
        tmp_path: Path) -> None:
    red = f"{ESC}[31m"
    sinfo = (f"debug|n1|4|8000|gpu:2|{red}nvme{ESC}[0m|1:00:00|1-infinite|de{ESC}]0;x"
             f"\a{red}bug*\r\n")
    env = _site(tmp_path, sinfo=f"printf '%b' '{sinfo}'\n",
                scontrol=f"printf 'PreemptMode = {red}REQUEUE{ESC}[0m{ESC}[2J\\n'\n",
                sacctmgr=f"echo '{red}no database{ESC}[0m' >&2; exit 1\n")
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stdout and "\r" not in proc.stdout and "\a" not in proc.stdout
    assert "PreemptMode = REQUEUE  (scontrol show config)" in proc.stdout, proc.stdout
    assert "partition debug: node features nvme" in proc.stdout, proc.stdout
    assert "failed (exit status 1): no database" in proc.stdout, proc.stdout
    text = (_user_dir(env) / "local.yaml").read_text()
    assert ESC not in text and "\a" not in text and "\r" not in text
    assert "debug" in yaml.safe_load(text)["partitions"]


def test_what_sacctmgr_printed_is_blamed_on_sacctmgr_and_the_rest_is_read(
        tmp_path: Path) -> None:
    env = _site(tmp_path, sacctmgr="echo 'normal|2-00:00:00'; echo 'long|forever'\n")
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "  QOS limits: `sacctmgr -n -P show qos format=Name,MaxWall` printed what the " \
           "probe cannot read: line 2: MaxWall: 'forever' is not a SLURM time" in proc.stdout, \
        proc.stdout
    assert "sinfo %l" not in proc.stdout + proc.stderr
    assert "partition debug (the default): 2 nodes" in proc.stdout  # sinfo's still read
    assert (_user_dir(env) / "local.yaml").exists()


def test_a_failed_write_shows_the_whole_report_then_names_what_failed(
        tmp_path: Path) -> None:
    env = _site(tmp_path)
    # local.yaml in the user's folder holds another profile: --write must not replace it
    other = _user_dir(env) / "local.yaml"
    other.write_text("name: other\nextends: local\n")
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "max_array_size: profile says 1001, the site says 5000" in proc.stdout, proc.stdout
    assert "partition debug (the default)" in proc.stdout and "Apptainer" not in proc.stdout
    assert "QOS limits: `sacctmgr -n -P show qos format=Name,MaxWall` failed (exit status " \
           "1): sacctmgr: error: no accounting storage" in proc.stdout, proc.stdout
    assert f"--write: {other} holds another profile than 'local'" in proc.stderr, proc.stderr
    assert other.read_text() == "name: other\nextends: local\n"
    assert sorted(p.name for p in other.parent.iterdir()) == ["local.yaml"]


def test_sinfo_failing_under_write_shows_the_report_and_sinfos_own_words(
        tmp_path: Path) -> None:
    env = _site(tmp_path, sinfo="echo 'slurm_load_partitions: Unable to contact slurm "
                                "controller (connect failure)' >&2; exit 1\n")
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "KillWait = 30 sec  (scontrol show config)" in proc.stdout, proc.stdout
    assert "sinfo could not be read" in proc.stderr, proc.stderr
    assert "Unable to contact slurm controller (connect failure)" in proc.stderr, proc.stderr
    assert not (Path(env["HOME"]) / ".config").exists()


def test_after_write_the_advice_fits_what_happened(tmp_path: Path) -> None:
    """A value no command can write (a constraint no node has) still differs: the probe
    says to edit the file it wrote, never to move that file aside."""
    env = _site(tmp_path)
    mine = _user_dir(env) / "local.yaml"
    mine.write_text(MINE + "constraints:\n  nvme:\n    gpus_per_node: 2\n    cpus_per_node: 4"
                           "\n    mem_per_node: 8000M\n    max_time: null\n")
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "move it aside" not in proc.stdout and "aside" not in proc.stdout, proc.stdout
    assert f"{mine} still differs from the site in 1 value(s) that no command gave a value " \
           "to write for" in proc.stdout, proc.stdout
    assert "  constraints.nvme: profile lists it, no node of the site has that feature" \
        in proc.stdout.split("still differs")[1], proc.stdout
    assert os.path.exists(f"{mine}.1")


def test_write_to_a_profile_whose_path_holds_a_line_break(tmp_path: Path) -> None:
    """The comments name the profile's file: a line break in its path stays on one line."""
    env = _site(tmp_path)
    folder = tmp_path / "my\nprofiles $(x)"
    folder.mkdir()
    mine = folder / "mine.yaml"
    mine.write_text("name: mine\nextends: local\n")
    proc = run_cli(["clusters", "probe", "mine", "--profile", str(mine), "--write"], env=env,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(mine.read_text())["partitions"]["debug"]["gpus_per_node"] == 2
    assert Path(f"{mine}.1").read_text() == "name: mine\nextends: local\n"


def test_write_into_a_read_only_folder_is_a_named_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a read-only file system even removing a file that is not there fails (EROFS)."""
    import errno

    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "local.yaml"
    path.write_text(MINE)

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    prof = Registry([path], environ={}).get("local")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SINFO_LOCAL))
    real_open = os.open

    def no_new_file(name: str, flags: int, *args: int) -> int:
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", name)
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", no_new_file)
    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(ConfigError, match=r"cannot write .*Read-only file system; nothing was"):
        write.write_profile(prof, site, path)
    monkeypatch.undo()
    assert path.read_text() == MINE and sorted(p.name for p in tmp_path.iterdir()) == [
        "local.yaml"]


def test_a_profile_that_cannot_be_replaced_leaves_no_copy_and_the_same_one_no_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename over the profile fails (EBUSY: a file bound over, say) after its copy
    was kept: "nothing was changed" holds for the folder too. Written again with the same
    values, the file is left as it is and no copy of an identical file is made."""
    import errno

    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "local.yaml"
    path.write_text(MINE)
    prof = Registry([path], environ={}).get("local")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SINFO_LOCAL))

    def busy(src: object, dst: object) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", str(dst))

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", busy)
        with pytest.raises(ConfigError, match=r"cannot write .*busy; nothing was changed"):
            write.write_profile(prof, site, path, when="2026-01-02")
    assert path.read_text() == MINE and sorted(p.name for p in tmp_path.iterdir()) == [
        "local.yaml"]
    assert write.write_profile(prof, site, path, when="2026-01-02") == tmp_path / "local.yaml.1"
    written = path.read_text()
    prof = Registry([path], environ={}).get("local")
    assert write.write_profile(prof, site, path, when="2026-01-02") == path  # unchanged
    assert write.write_profile(prof, site, path, when="2026-02-03") == path  # a day later
    assert path.read_text() == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.yaml", "local.yaml.1"]


def test_a_gpu_count_no_node_holds_is_refused_naming_sinfos_line() -> None:
    line = "debug|n1|4|8000|gpu:a100:99999999999999999999999|(null)|1:00:00|1-infinite|debug*"
    with pytest.raises(ValueError, match=r"sinfo line 1: GPU count '9+' is not a number of "
                                         r"GPUs: 'debug\|n1"):
        probe_site.parse_sinfo(line + "\n")


def test_sinfo_that_lists_no_node_is_said(tmp_path: Path) -> None:
    env = _site(tmp_path, sinfo="exit 0\n")
    proc = run_cli(["clusters", "probe", "local"], env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert "partitions and nodes: `sinfo -h -N -o '%R|%N|%c|%m|%G|%f|%l|%s|%P'` listed no " \
           "node" in proc.stdout, proc.stdout
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 3 and "listed no node" in proc.stderr, proc.stderr
