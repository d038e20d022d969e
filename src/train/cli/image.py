"""`train image`: lint, translate, build, test, export, digest and derive images."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from train.common.errors import EXIT_OK, UsageError, install_hint

if TYPE_CHECKING:
    from train.cli.common import Subparsers
    from train.images.defs import DefFile


def add_image(sub: Subparsers) -> None:
    """`train image ACTION [IMAGE ...]`."""
    p = sub.add_parser("image", help="lint, translate, build, test, export and digest images",
                       description="Container images from containers/*.def (the copy "
                       "installed with the package when not run from a clone; --defs DIR "
                       "names another folder). Works from any directory: %%files sources "
                       "resolve from the folder above the definitions, as `apptainer build` "
                       "run from the repository root does.")
    p.add_argument("action", choices=["lint", "translate", "build", "test", "export",
                                      "digest", "new"],
                   help="digest: the content digest of a built image (every file's path, "
                   "mode and sha256), to compare an image on the cluster with CI's")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="base, sc2, navsim or a .def path (lint: all when none given)")
    p.add_argument("--defs", type=Path, default=None, metavar="DIR",
                   help="folder holding the .def files and requirements/ (default: "
                   "$TRAIN_DEFS, the clone's containers/, then the installed copy)")
    build = p.add_argument_group("building", "translate, build, test, digest, export")
    build.add_argument("--no-cache", action="store_true",
                       help="build: no effect since every Docker build starts from the base "
                       "image (kept for scripts that pass it)")
    build.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                       help="override a %%arguments default (may repeat)")
    build.add_argument("--localimage", action="append", default=[], metavar="SIF=TAG",
                       help="docker tag to use for a localimage bootstrap (may repeat)")
    build.add_argument("--tag", default=None, help="docker tag (default: train/IMAGE:local)")
    new = p.add_argument_group("new", "a definition of your own, on one of ours")
    new.add_argument("--from", dest="from_image", choices=["base", "sc2", "navsim"],
                     default="base", help="new: the image of ours to build on")
    new.add_argument("--requirements", type=Path, default=None, metavar="FILE",
                     help="new: your requirements (name and version specifier, one a line)")
    new.add_argument("--editable", type=Path, default=None, metavar="DIR",
                     help="new: a local project installed editable at /opt/src/NAME")
    new.add_argument("--find-links", type=Path, default=None, metavar="DIR",
                     help="new: resolve from this folder of wheels only, not the index")
    engine = p.add_argument_group("engine", "apptainer or docker, and how it builds")
    engine.add_argument("--engine", choices=["auto", "apptainer", "docker"], default="auto")
    engine.add_argument("--fakeroot", action="store_true", help="apptainer build --fakeroot")
    engine.add_argument("--base-sif", type=Path, default=None, metavar="SIF",
                        help="build, apptainer: build on this local SIF (Bootstrap: "
                        "localimage) instead of the base the definition's header names; "
                        "the header's From: arguments default to its path")
    engine.add_argument("--network", choices=["none", "default", "host"], default=None,
                        help="build, docker engine: the network the build's steps reach (default "
                        "none: offline inputs only, as in CI; `default` for a real build that "
                        "downloads the CUDA base's packages, the game and the wheels)")
    output = p.add_argument_group("output")
    output.add_argument("--out", type=Path, default=None,
                        help="translate: context dir; build, test, digest: SIF path (docker "
                        "build: the build record's path); export: tar path; digest: also write "
                        "the listing there when a docker tag is used")


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag}: expected NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def _cmd_image(args: argparse.Namespace) -> int:
    from train.images.defs import containers_dir, find_def, parse
    from train.images.lint import lint_all

    if args.action == "new":
        return _image_new(args, containers_dir(args.defs))
    if args.action == "lint":
        paths = ([find_def(i, args.defs) for i in args.images]
                 or sorted(containers_dir(args.defs).glob("*.def")))
        violations = lint_all(paths)
        for v in violations:
            print(v)
        print(f"{len(paths)} definition(s), {len(violations)} violation(s)", file=sys.stderr)
        return 1 if violations else EXIT_OK
    if len(args.images) != 1:
        raise UsageError(f"image {args.action}: name exactly one image")
    if args.base_sif is not None and args.action != "build":
        raise UsageError(f"--base-sif: for `train image build`, not image {args.action}")
    path = find_def(args.images[0], args.defs)
    d = parse(path)
    out = args.out.resolve() if args.out is not None else None
    auto = "apptainer" if shutil.which("apptainer") else "docker"  # clusters; else workstations
    image = _Image(definition=d, root=path.parent.parent,
                   build_args=_pairs(args.build_arg, "--build-arg"),
                   localimages=_pairs(args.localimage, "--localimage"),
                   tag=args.tag or f"train/{d.name}:local",
                   engine=auto if args.engine == "auto" else args.engine,
                   out=out, sif=out or Path(f"{d.name}.sif").resolve())
    actions = {"translate": _image_translate, "build": _image_build, "test": _image_test,
               "digest": _image_digest, "export": _image_export}
    return actions[args.action](args, image)


@dataclass
class _Image:
    """One image's definition and what the flags say about building it."""

    definition: DefFile
    root: Path  # %files sources resolve from above containers/
    build_args: dict[str, str]
    localimages: dict[str, str]
    tag: str
    engine: str
    out: Path | None  # resolved before any cwd change
    sif: Path


def _image_translate(args: argparse.Namespace, im: _Image) -> int:
    from train.images.dockerengine import write_context
    from train.images.dockerfile import translate

    if im.out is None:
        print(translate(im.definition, im.build_args, im.localimages).dockerfile, end="")
    else:
        write_context(im.definition, im.out, im.build_args, im.localimages, im.root)
        print(f"build context written to {im.out}")
    return EXIT_OK


def _image_build(args: argparse.Namespace, im: _Image) -> int:
    from train.images.build import apptainer_build
    from train.images.dockerengine import docker_build

    if im.engine == "apptainer":
        if args.network not in (None, "default"):
            raise UsageError("--network: apptainer builds use the host's network; "
                             "--network none|host is for --engine docker")
        result = apptainer_build(im.definition, im.root, im.sif, im.build_args,
                                 args.fakeroot, base_sif=args.base_sif)
        print(f"built {im.sif}")
    else:
        if args.base_sif is not None:
            raise UsageError("--base-sif: for --engine apptainer; a Docker build names the "
                             "tag of its localimage base with --localimage SIF=TAG")
        result = docker_build(im.definition, im.root, im.tag, im.build_args,
                              im.localimages, network=args.network or "none", record=im.out)
        print(f"built {im.tag} ({result.image})")
    print("\n".join(result.summary()))
    return EXIT_OK


def _image_test(args: argparse.Namespace, im: _Image) -> int:
    from train.images.build import apptainer_test, smoke_args
    from train.images.dockerengine import docker_test

    smoke = smoke_args(im.definition)
    report = apptainer_test(im.sif, smoke) if im.engine == "apptainer" \
        else docker_test(im.tag, smoke)
    print(report, end="")
    return EXIT_OK


def _image_digest(args: argparse.Namespace, im: _Image) -> int:
    from train.images.build import apptainer_content
    from train.images.content import digest
    from train.images.dockerengine import docker_content

    if im.engine == "apptainer":
        lines = apptainer_content(im.sif)
    else:
        lines = docker_content(im.tag)
        if im.out is not None:
            im.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{digest(lines)} {len(lines)} entries "
          f"({im.sif if im.engine == 'apptainer' else im.tag})")
    return EXIT_OK


def _image_export(args: argparse.Namespace, im: _Image) -> int:
    from train.images.dockerengine import docker_export

    if im.engine == "apptainer":
        raise UsageError("image export: an apptainer build is already a SIF file")
    print(docker_export(im.tag, im.out or Path(f"{im.definition.name}.tar").resolve()))
    return EXIT_OK


def _image_new(args: argparse.Namespace, containers: Path) -> int:
    from train.images.derive import PIP_INDEX, derive

    if len(args.images) != 1:
        raise UsageError("image new: name exactly one new image (NAME)")
    if args.requirements is None:
        raise UsageError("image new: --requirements FILE is required")
    index = (["--no-index", "--find-links", str(args.find_links.resolve())]
             if args.find_links is not None else ["--index-url", PIP_INDEX])
    made = derive(args.images[0], args.from_image, args.requirements, containers,
                  out=args.out, editable=args.editable, index_args=index)
    for request in made.dropped:
        print(f"note: {request.where} {request.text!r} left out: its marker is false for "
              f"the image ({made.target.describe()})", file=sys.stderr)
    if made.duplicates:
        print(f"note: {made.duplicates} requirement(s) repeated an earlier one; each "
              "counted once", file=sys.stderr)
    for copy in made.kept:
        print(f"kept the earlier {copy.name.rsplit('.', 1)[0]} as {copy}", file=sys.stderr)
    verb = "unchanged:" if {made.definition, made.lock} <= set(made.unchanged) else "wrote"
    print(f"{verb} {made.definition} and {made.lock} ({len(made.added)} package(s) added to "
          f"{args.from_image}: {', '.join(f'{p.name}=={p.version}' for p in made.added)})")
    print(f"next: train image lint {made.definition}; train image build {made.definition} "
          f"(Docker: --localimage {args.from_image}.sif=train/{args.from_image}:local)")
    if importlib.util.find_spec("spython") is None:  # what `image lint` reads .def files with
        print(f"note: `train image lint` needs the image tools, not installed here: "
              f"{install_hint('images')}", file=sys.stderr)
    root = made.definition.parent.parent
    if not ((root / "pyproject.toml").is_file() or (root / ".git").exists()):
        print(f"note: `train image build` builds from a source tree, and {root} has no "
              "pyproject.toml or .git: build from a project folder (`--out` inside it) or "
              "`git init` there first", file=sys.stderr)
    return EXIT_OK
