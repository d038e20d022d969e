"""The one YAML reader for run configs, job files, profiles and defaults, bounded (MAX_BYTES;
MAX_NODES once aliases are expanded: a few hundred bytes of nested anchors can stand for
gigabytes) and with YAML 1.2's numbers, not 1.1's: `1:00:00` stays the text it looks like
(1.1 reads the base-60 integer 3600) and `1e-3` is a float. Errors are ConfigError naming
the field (the config key, or the file's role), quoting at most a short prefix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from train.common.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_NODES = 100_000
SHOWN = 60  # characters of a rejected value an error message quotes


def shown(value: Any) -> str:
    """repr(value), cut to SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema integers and floats."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?[0-9]+[eE][-+]?[0-9]+"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+.0123456789"))


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    return int(text, 0) if text.startswith(("0o", "0x")) else int(text, 10)


Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _construct_str(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    """A string; a lone surrogate (only a `\\uD800`-style escape makes one) is refused: it
    is no text, and fails later wherever it is written out (a job script, a path)."""
    value = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if _SURROGATE.search(value):
        raise yaml.constructor.ConstructorError(
            None, None, "an escape for a lone surrogate (U+D800..U+DFFF) is not text",
            node.start_mark)
    return value


Loader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def _strict(tag: str) -> None:
    """SafeLoader's constructor for `tag`, with what it raises on a malformed value
    (`!!bool 2` a KeyError, `!!float ''` an IndexError, `!!timestamp x` an
    AttributeError) turned into a ConstructorError at the value's line."""
    construct = yaml.SafeLoader.yaml_constructors[tag]

    def strict(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        try:
            return construct(loader, node)
        except (KeyError, IndexError, AttributeError, TypeError, ValueError):
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value as {tag.rsplit(':', 1)[-1]}",
                node.start_mark) from None

    Loader.add_constructor(tag, strict)


for _tag in ("bool", "float", "timestamp"):
    _strict(f"tag:yaml.org,2002:{_tag}")


def _expanded_size(root: yaml.Node) -> int | None:
    """Nodes the document has once every alias is expanded (memoised, so linear in the
    number of distinct nodes; stops counting past MAX_NODES), or None when a node contains
    itself through an alias (`a: &a [*a]`), which no expansion ends."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: their size is being counted
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            return None
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                return None
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def load_text(text: str, source: str, field: str) -> Any:
    """Parse one YAML document; `source` names it in messages, `field` is the error's field."""
    if len(text) > MAX_BYTES:
        raise ConfigError(field, f"{source} is {len(text)} bytes; YAML input is limited to "
                          f"{MAX_BYTES} bytes")
    loader: Loader | None = None
    try:
        loader = Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node)
        if size is None:
            raise ConfigError(field, f"{source} has an alias inside its own anchor (a "
                              "recursive &anchor/*alias), which never ends")
        if size > MAX_NODES:
            raise ConfigError(field, f"{source} expands to more than {MAX_NODES} values "
                              "through YAML aliases (&anchor/*alias); write it out plainly")
        return loader.construct_document(node)
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ConfigError(field, f"{source}: {str(exc)[:120]}") from None
    except yaml.YAMLError as exc:
        message = str(exc)
        if len(message) > 400:
            message = message[:400] + "..."
        raise ConfigError(field, f"{source} is not valid YAML: {message}") from None
    except RecursionError:
        raise ConfigError(field, f"{source} nests too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_file(path: Path, field: str) -> Any:
    """A YAML file; unreadable, oversized, non-UTF-8 or invalid: ConfigError naming `field`."""
    try:
        if not path.exists():
            raise ConfigError(field, f"cannot read {path}: no such file")
        if not path.is_file():  # a FIFO would block, /dev/zero never ends
            raise ConfigError(field, f"{path} is not a regular file")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError(field, f"{path} is over {MAX_BYTES} bytes; YAML input is "
                              "limited to that")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.start})") from None
    return load_text(text, str(path), field)
