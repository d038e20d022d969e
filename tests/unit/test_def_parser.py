"""Our .def parser against Apptainer's own rules, and the lint rules for Apptainer's traps.

Each parser case gives the verdict Apptainer reaches (read from its source, releases 1.2.0 to
1.5.3: pkg/build/types/parser/deffile.go unless named otherwise); ours must be the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_images import GOOD, _write
from train.images import defs, lint
from train.images.defs import DefError, parse
from train.images.lint import lint_def

HEAD = "Bootstrap: docker\nFrom: debian:12.5\n"


def _def(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.def"
    path.write_text(text, encoding="utf-8")
    return path


def _rejects(tmp_path: Path, text: str, rule: str = "section") -> DefError:
    with pytest.raises(DefError) as info:
        parse(_def(tmp_path, text))
    assert info.value.rule == rule, info.value
    return info.value


# --- sections: which names are valid --------------------------------------------------

@pytest.mark.parametrize("header", [
    "%pre",  # validSections has "pre"
    "%POST", "%Files", "%Help",  # getSectionName lower-cases the name
    "%%post",  # getSectionName trims every leading %
    "%appinstall foo", "%apphelp foo", "%apprun foo", "%appenv foo", "%applabels foo",
    "%appfiles foo", "%apptest foo", "%appstart foo",  # appSections, with an app name
])
def test_sections_apptainer_accepts(tmp_path: Path, header: str) -> None:
    d = parse(_def(tmp_path, f"{HEAD}{header}\n    true\n"))
    assert len(d.sections) == 1
    key = next(iter(d.sections))
    assert key == header.lstrip("%").lower() or key == header.lstrip("%")


@pytest.mark.parametrize("header", [
    "%app",  # neither in validSections nor appSections: populateDefinition's InvalidSection
    "%post2", "%Files-evil", "%setupx", "%",  # not in validSections
    "%appinstall",  # parseTokenSection: "could not be split into section name and app name"
    "%AppInstall foo",  # the app key keeps its case; populateDefinition looks it up as is
    "%post\t-c bash",  # getSectionName splits at a space only: "post\t-c" is invalid
])
def test_sections_apptainer_rejects(tmp_path: Path, header: str) -> None:
    _rejects(tmp_path, f"{HEAD}{header}\n    true\n")


def test_indented_header_is_invalid(tmp_path: Path) -> None:
    # scanDefinitionFile starts a section at any line whose first word starts with %, but
    # the token is not trimmed, so getSectionName returns "" (or "\t%post"): invalid
    _rejects(tmp_path, f"{HEAD}%post\n    echo hi\n  %test\n    true\n")
    _rejects(tmp_path, f"{HEAD}\t%post\n    echo hi\n")


def test_percent_word_inside_a_script_ends_the_section(tmp_path: Path) -> None:
    # scanDefinitionFile: a %-word at the start of any line is a section boundary
    err = _rejects(tmp_path, f"{HEAD}%help\n    Progress is shown as\n    %d done\n")
    assert err.line == 5
    d = parse(_def(tmp_path, f"{HEAD}%help\n    shown as 100% done\n"))  # not first word
    assert d.sections["help"].text == "shown as 100% done"


def test_section_arguments(tmp_path: Path) -> None:
    # parseTokenSection: what follows the first space is the section's Args
    d = parse(_def(tmp_path, f"{HEAD}%post -c /bin/bash\n    true\n%test # a note\n    true\n"))
    assert d.sections["post"].args == "-c /bin/bash"
    assert d.sections["test"].args == "# a note"


# --- repeated sections are joined ---------------------------------------------------------

def test_repeated_sections_are_joined_with_their_line_numbers(tmp_path: Path) -> None:
    # parseTokenSection: sections[key].Script += body; a later header's Args replace
    text = (f"{HEAD}%post\n    echo one\n%labels\n    a 1\n%post -c /bin/bash\n    echo two\n"
            "%labels\n    a 2\n")
    d = parse(_def(tmp_path, text))
    post = d.sections["post"]
    assert post.lines == [(4, "    echo one"), (8, "    echo two")]
    assert post.line == 3 and post.headers == [3, 7] and post.args == "-c /bin/bash"
    assert d.sections["labels"].body() == [(6, "a 1"), (10, "a 2")]  # GetLabels: last wins


def test_repeated_files_sections_are_grouped_by_their_arguments(tmp_path: Path) -> None:
    # parseTokenSection appends entries to the group with the same Args; stage.copyFiles
    # copies every group whose Args are blank after '#', in the order groups first appear
    (tmp_path / "a").write_text("")
    text = f"{HEAD}%files\n    a /a\n%files # note\n    a /b\n%files\n    a /c\n%files junk\n    a /d\n"
    d = parse(_def(tmp_path, text))
    assert d.files() == [(4, "a", "/a"), (8, "a", "/c"), (6, "a", "/b")]
    assert d.sections["files junk"].body() == [(10, "a /d")]  # Apptainer ignores it


def test_files_entries_split_as_apptainer(tmp_path: Path) -> None:
    # fileSplitter: double quotes group, {{ NAME }} stays whole, then '"' is trimmed
    text = f'{HEAD}%arguments\n    N=x\n%files\n    "a b" /c\n    {{{{ N }}}} /d\n    e\n'
    d = parse(_def(tmp_path, text))
    assert d.files() == [(6, "a b", "/c"), (7, "{{ N }}", "/d"), (8, "e", "")]


# --- lines ----------------------------------------------------------------------------

def test_lines_end_at_newline_only(tmp_path: Path) -> None:
    # bufio.ScanLines: split at \n, drop one trailing \r; \f or \x1c do not end a line
    d = parse(_def(tmp_path, HEAD.replace("\n", "\r\n") + "%post\r\n    a\fb\x1cc\r\n"))
    assert d.header["from"] == (2, "debian:12.5")
    assert d.sections["post"].lines == [(4, "    a\fb\x1cc")]


def test_section_over_64k_is_refused(tmp_path: Path) -> None:
    # bufio.NewScanner without Buffer(): tokens stop at bufio.MaxScanTokenSize (64 KiB)
    big = "    echo " + "x" * 990 + "\n"
    ok = f"{HEAD}%post\n" + big * 60 + "%test\n    true\n"
    assert parse(_def(tmp_path, ok)).sections["post"].lines[-1][0] == 63
    err = _rejects(tmp_path, f"{HEAD}%post\n" + big * 70 + "%test\n    true\n", rule="size")
    assert err.line == 3
    _rejects(tmp_path, f"{HEAD}%test\n    true\n%post\n" + big * 70, rule="size")


# --- header -------------------------------------------------------------------------------

def test_header_comments_and_case(tmp_path: Path) -> None:
    # doHeader: lines starting with # skipped, everything from '#' cut, keys lower-cased
    d = parse(_def(tmp_path, "# top\nBOOTSTRAP: docker  # the agent\n  From: debian:12.5#x\n"
                   "%post\n    true\n"))
    assert d.header == {"bootstrap": (2, "docker"), "from": (3, "debian:12.5")}


def test_header_repeats_keep_the_last_value(tmp_path: Path) -> None:
    # doHeader: header[key] = val, so the last line wins
    d = parse(_def(tmp_path, HEAD + "From: debian:12.6\n%post\n    true\n"))
    assert d.header["from"] == (3, "debian:12.6") and d.header_repeats == [(3, "from")]


def test_header_continuation(tmp_path: Path) -> None:
    # doHeader: a value ending in '\' continues on the next line
    d = parse(_def(tmp_path, "Bootstrap: docker\nFrom: debian:\\\n    12.5\n%post\n    true\n"))
    assert d.header["from"] == (2, "debian:12.5")
    # ... and a blank line after it writes into a nil map: Apptainer panics
    _rejects(tmp_path, "Bootstrap: docker\nFrom: debian:\\\n\n%post\n", rule="header")


@pytest.mark.parametrize(("text", "rule"), [
    ("Bootstrap: docker\nFrom: debian:12.5\nFoo: bar\n", "header"),  # validHeaders
    ("Bootstrap: docker\nFrom debian\n", "header"),  # "header key ... had no val"
    ("Bootstrap: Docker\nFrom: debian:12.5\n", "header"),  # conveyorPacker: case-sensitive
    ("Bootstrap: docker\n", "header"),  # ours: From is needed (Apptainer: at build time)
    # parser.All: each column-0 "bootstrap:" starts a stage, so these are two stages
    (HEAD + "%post\n    true\nBootstrap: docker\nFrom: debian:12.5\n", "section"),
    ("From: debian:12.5\nBootstrap: docker\n", "section"),
])
def test_header_apptainer_rejects(tmp_path: Path, text: str, rule: str) -> None:
    _rejects(tmp_path, text + "%post\n    true\n", rule=rule)


def test_header_keys_apptainer_accepts(tmp_path: Path) -> None:
    # validHeaders, the otherurl<N> family, and an indented Bootstrap (no stage split)
    d = parse(_def(tmp_path, "  Bootstrap: docker\nFrom: debian:12.5\nOtherURL1: x\n"
                   "Stage: one\n%post\n    true\n"))
    assert set(d.header) == {"bootstrap", "from", "otherurl1", "stage"}


# --- reading ------------------------------------------------------------------------------

def test_unreadable_and_non_utf8_are_parse_violations(tmp_path: Path) -> None:
    bad = tmp_path / "bad.def"
    bad.write_bytes(HEAD.encode() + b"%post\n    echo \xff\n")
    assert [(v.rule, v.line) for v in lint_def(bad)] == [("parse", 4)]
    folder = tmp_path / "folder.def"
    folder.mkdir()
    assert [v.rule for v in lint_def(folder)] == ["parse"]
    assert [v.rule for v in lint_def(tmp_path / "missing.def")] == ["parse"]


def test_oversized_file_is_refused_before_spython(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def never(path: Path) -> None:
        raise AssertionError("spython must not read an oversized file")

    monkeypatch.setattr(lint, "spython_check", never)
    path = _def(tmp_path, HEAD + "%post\n" + "    true\n" * (defs.MAX_BYTES // 9 + 1))
    assert [(v.rule, v.line) for v in lint_def(path)] == [("size", 1)]


def test_parser_makes_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work counted, not timed: each line is classified exactly once, whatever the size."""
    calls = 0
    real = defs._classify

    def counting(text: str) -> str:
        nonlocal calls
        calls += 1
        return real(text)

    monkeypatch.setattr(defs, "_classify", counting)
    for sections in (10, 1000):
        calls = 0
        text = HEAD + "".join(f"%post\n    echo {i}\n\n" for i in range(sections))
        d = parse(_def(tmp_path, text))
        assert calls == len(text.splitlines()) == len(d.lines)
        assert len(d.sections["post"].lines) == 2 * sections


# --- lint rules: one failing and one passing definition each -----------------------------

def _lint(tmp_path: Path, old: str, new: str) -> list[tuple[str, int]]:
    assert old in GOOD
    return [(v.rule, v.line) for v in lint_def(_write(tmp_path, GOOD.replace(old, new)))]


def test_good_passes_every_rule(tmp_path: Path) -> None:
    assert lint_def(_write(tmp_path, GOOD)) == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("LOCK=ok.txt", "LOCK=ok.txt\n    EMPTY=", [("arguments-empty", 7)]),
    ("LOCK=ok.txt", "LOCK=ok.txt\n    Q=a=b", [("arguments-compat", 7)]),
    # %test: several commands, no set -e first
    ("    test -f /greeting\n", "    test -f /greeting\n    true\n", [("test-exit", 26)]),
    ("    exec python", "    cd /\n    python", [("test-exit", 23)]),
    ("%files\n", "%setup\n    touch /x\n\n%files\n", [("section", 8)]),
    ("%labels\n", "%post2\n", [("section", 29)]),
    ("%labels\n", "%Files-evil\n", [("section", 29)]),
    ("%labels\n", "%appinstall foo\n    true\n%labels\n", [("section", 29)]),
    ("%post\n", "%post -c /bin/bash\n", [("section", 12)]),
    ("%files\n", "%files from other\n    a b\n%files\n", [("section", 8)]),
    ("Bootstrap: docker", "Bootstrap: docker\nBootstrap: docker", [("section", 2)]),
    ("From: {{ BASE }}", "From: {{ BASE }}\nFrom: {{ BASE }}", [("header", 3)]),
    ("From: {{ BASE }}", "From: {{ NOPE }}", [("placeholder", 2)]),
    ("    export GREETING", "    # {{ NOPE }}\n    export GREETING", [("placeholder", 13)]),
    ('echo "$GREETING"', 'echo "#x {{ LOCK }}"', [("placeholder", 14)]),
    ("    README.md\n", "    /etc/passwd /x\n", [("files-source", 10)]),
    ("    README.md\n", "    ../../etc /x\n", [("files-source", 10)]),
    ("    README.md\n", "    missing.txt /x\n", [("files-source", 10)]),
    ("    README.md\n", "    nothing*.md /x\n", [("files-source", 10)]),
    # a glob that matches: Apptainer expands it, the Docker translation cannot do the same
    ("    README.md\n", "    README*.md /x\n", [("files-source", 10)]),
    ("    README.md\n", "    $HOME /x\n", [("files-source", 10)]),
    ("    README.md\n", "    README.md /x\x0bbad\n", [("files-source", 10)]),
    ("    README.md\n", "    'README.md' /x\n", [("files-source", 10)]),
])
def test_lint_rule_fails(tmp_path: Path, old: str, new: str,
                         expected: list[tuple[str, int]]) -> None:
    assert _lint(tmp_path, old, new) == expected


@pytest.mark.parametrize(("old", "new"), [
    ("LOCK=ok.txt", "LOCK=ok.txt\n    FULL=value"),  # arguments-empty
    ("    test -f /greeting\n", "    set -eu\n    test -f /greeting\n    true\n"),  # test-exit
    ("    test -f /greeting\n", "    test -f /greeting && true\n"),
    ("    exec python", "    cd /\n    exec python"),  # %runscript ending in exec
    ("%post\n", "%post # a comment only\n"),  # section arguments that are a comment
    ('echo "$GREETING"', 'echo "#!{{ LOCK }}"'),  # '#!' does not make a comment line
    ("    README.md\n", '    "README.md" /x\n'),  # double quotes are Apptainer's
])
def test_lint_rule_passes(tmp_path: Path, old: str, new: str) -> None:
    assert _lint(tmp_path, old, new) == []


def test_files_source_symlink_out_of_the_repository(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir(exist_ok=True)
    path = _write(tmp_path, GOOD.replace("    README.md\n", "    link /x\n"))
    (tmp_path / "link").symlink_to(outside)
    assert [(v.rule, v.line) for v in lint_def(path)] == [("files-source", 10)]


DERIVED = GOOD.replace("Bootstrap: docker\nFrom: {{ BASE }}", "Bootstrap: localimage\n"
                       "From: {{ BASE_SIF }}").replace("BASE=debian:12.5", "BASE_SIF=base.sif").replace(
    "org.example.base {{ BASE }}", "org.example.base {{ BASE_SIF }}")


@pytest.mark.parametrize(("files", "bad"), [
    ("    src /opt/src\n", True),  # a destination of base.def's %files
    ("    src /opt\n", True),  # a parent of one
    ("    src /usr/local\n", True),  # a standard folder
    ("    src /opt/new/\n", True),  # a trailing '/' makes the folder first
    ("    src /opt/src/\n", True),  # the same with a trailing '/'
    ("    src\n", False),  # no destination: /src (CopyFromHost), new in the base
    ("    src /opt/src-derived\n", False),  # a new path
    ("    README.md /opt/src\n", False),  # a file replaces, it does not nest
])
def test_files_nesting(tmp_path: Path, files: str, bad: bool) -> None:
    _write(tmp_path, GOOD)
    (tmp_path / "containers" / "image.def").rename(tmp_path / "containers" / "base.def")
    path = _write(tmp_path, DERIVED.replace("%files\n    src /opt/src\n    README.md\n",
                                            "%files\n" + files))
    assert [v.rule for v in lint_def(path)] == (["files-nesting"] if bad else [])


def test_files_nesting_without_a_base_definition(tmp_path: Path) -> None:
    derived = DERIVED.replace("    README.md\n", "    src /etc\n")
    path = _write(tmp_path, derived)  # no base.def beside it: standard folders only
    assert [(v.rule, v.line) for v in lint_def(path)] == [("files-nesting", 10)]
    assert lint_def(_write(tmp_path, DERIVED)) == []  # /opt/src unknown without base.def


def test_section_violations_never_raise(tmp_path: Path) -> None:
    for header in ("%post2", "%Files-evil", "%app", "   %post", "%\x00"):
        path = _write(tmp_path, GOOD.replace("%labels\n", f"{header}\n"))
        assert [v.rule for v in lint_def(path)] == ["section"], header
