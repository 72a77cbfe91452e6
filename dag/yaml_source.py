"""Load YAML into plain Python data while remembering where every value came from.

PyYAML's ``safe_load`` throws node positions away, but spec errors must name
the file, line and column of the bad value. So we compose the node tree and
build the data ourselves, recording ``key path -> (line, column)``. The
builder is defensive: alias bombs, deep nesting, duplicate keys, non-string
keys, non-UTF-8 bytes and huge numbers all become ``SpecError``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hetrun.errors import SpecError

# Bounds that keep a hostile or broken file from eating memory or the stack.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 48
MAX_NODES = 200_000

KeyPath = tuple[str | int, ...]

_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")
_MERGE_TAG = "tag:yaml.org,2002:merge"
# A plain scalar with an exponent and no dot (1e-3, 5E+2), which YAML 1.2 reads as a float.
_EXP_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+")


@dataclass
class SourceDoc:
    """Parsed YAML data plus the position of every node, keyed by key path."""

    data: Any
    file: str
    marks: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def mark_for(self, path: KeyPath) -> tuple[int | None, int | None]:
        """Line/column (1-based) of ``path``, or of its nearest ancestor that has one."""
        p = tuple(path)
        while True:
            if p in self.marks:
                return self.marks[p]
            if not p:
                return None, None
            p = p[:-1]


def format_path(path: KeyPath) -> str:
    """``('components', 'learner', 'mem')`` -> ``components.learner.mem``; list items as ``[i]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.marks: dict[KeyPath, tuple[int, int]] = {}
        self.count = 0
        self.constructor = yaml.SafeLoader("")

    def fail(self, node: yaml.Node, path: KeyPath, message: str, hint: str | None = None) -> SpecError:
        return SpecError(
            message,
            file=self.file,
            key_path=format_path(path) or None,
            line=node.start_mark.line + 1,
            column=node.start_mark.column + 1,
            hint=hint,
        )

    def build(self, node: yaml.Node, path: KeyPath, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.fail(node, path, f"document has more than {MAX_NODES} values (alias bomb?)",
                            hint="a job spec is a few dozen keys; remove the repeated aliases")
        if depth > MAX_DEPTH:
            raise self.fail(node, path, f"nesting deeper than {MAX_DEPTH} levels",
                            hint="flatten the document; job specs are at most a few levels deep")
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN_TAGS:
            raise self.fail(node, path, f"YAML tag {node.tag!r} is not supported in a job spec",
                            hint="remove the !tag; plain mappings and lists only")
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i), depth + 1) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: KeyPath, depth: int) -> dict[str, Any]:
        own_pairs = sum(1 for key_node, _ in node.value if key_node.tag != _MERGE_TAG)
        try:
            self.constructor.flatten_mapping(node)  # resolves `<<: *base` merge keys
        except yaml.YAMLError as exc:
            raise self.fail(node, path, f"invalid merge key: {exc}") from None
        # flatten_mapping puts the merged pairs first (the last of them wins), then the
        # mapping's own pairs, which override merged ones: only an own key twice is a mistake.
        merged_pairs = len(node.value) - own_pairs
        out: dict[str, Any] = {}
        own_keys: set[str] = set()
        for i, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, path, "a key must be a plain string, not a list or mapping")
            key = self._scalar(key_node, path)
            if isinstance(key, bool) or key is None or not isinstance(key, (str, int, float)):
                raise self.fail(key_node, path, f"key {key_node.value!r} is read as {type(key).__name__}, not a string",
                                hint=f'quote it: "{key_node.value}"')
            key = key_node.value if not isinstance(key, str) else key
            if key in own_keys:
                raise self.fail(key_node, (*path, key), f"duplicate key {key!r}",
                                hint="each key may appear once; remove one of them")
            if i >= merged_pairs:
                own_keys.add(key)
            if key in out:  # a merged value overridden: its positions must not linger
                self._forget((*path, key))
            out[key] = self.build(value_node, (*path, key), depth + 1)
            self.marks[(*path, key)] = (value_node.start_mark.line + 1, value_node.start_mark.column + 1)
        return out

    def _forget(self, prefix: KeyPath) -> None:
        n = len(prefix)
        for p in [p for p in self.marks if p[:n] == prefix]:
            del self.marks[p]

    def _scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        try:
            value = self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            raise self.fail(node, path, f"cannot read value {node.value[:80]!r}: {exc}") from None
        # YAML 1.1 reads 00:30:00 as the base-60 integer 1800. Users mean a
        # Slurm time string, so a plain scalar with a colon stays text.
        if node.style is None and isinstance(value, (int, float)) and not isinstance(value, bool) and ":" in node.value:
            return node.value
        # YAML 1.1 (PyYAML) reads 1e-3 as a string; YAML 1.2 and every user mean the float.
        if node.style is None and isinstance(value, str) and _EXP_FLOAT_RE.fullmatch(value):
            return float(value)
        return value


def _check_depth(text: str, file: str) -> None:
    """Reject deep nesting from the event stream (PyYAML's parser is iterative, its
    composer recursive: thousands of '[' would otherwise crawl into a RecursionError)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise SpecError(f"nesting deeper than {MAX_DEPTH} levels", file=file,
                                line=mark.line + 1 if mark else None,
                                column=mark.column + 1 if mark else None,
                                hint="flatten the document; job specs are at most a few levels deep")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def parse_yaml_text(text: str, file: str) -> SourceDoc:
    """Parse one YAML document (text) into data + marks. Raises only ``SpecError``."""
    if "\x00" in text:
        raise SpecError("file contains a NUL byte; it is not a YAML text file", file=file)
    try:
        _check_depth(text, file)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecError(
            f"invalid YAML: {exc.problem or exc.context}",
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
            hint="check indentation, quoting and colons around this position",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", file=file) from None
    except RecursionError:
        raise SpecError(f"nesting too deep to parse (more than {MAX_DEPTH} levels)", file=file) from None
    if node is None:
        raise SpecError("the file is empty; expected a mapping with name, workload, components, training",
                        file=file)
    builder = _Builder(file)
    try:
        data = builder.build(node, (), 0)
    except RecursionError:
        raise SpecError(f"nesting too deep (more than {MAX_DEPTH} levels)", file=file) from None
    return SourceDoc(data=data, file=file, marks=builder.marks)


def _read_regular_file(path: Path, limit: int, name: str) -> bytes:
    """At most ``limit`` bytes of ``path``, refusing anything but a regular file.

    Opened non-blocking and checked with fstat before reading: a FIFO (or a
    terminal, /dev/stdin, a socket) would otherwise block the command forever.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(name)
        if not stat.S_ISREG(mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device"
                    if stat.S_ISCHR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise SpecError(f"is {kind}, not a job YAML file", file=name,
                            hint="give the path of a regular file (save piped YAML to a file first)")
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            return fh.read(limit)
    finally:
        if fd >= 0:
            os.close(fd)


def read_yaml_file(path: str | Path) -> SourceDoc:
    """Read and parse a YAML file. Raises only ``SpecError`` (missing file, bad bytes, bad YAML)."""
    p = Path(path)
    name = str(path)
    try:
        raw = _read_regular_file(p, MAX_FILE_BYTES + 1, name)
    except FileNotFoundError:
        raise SpecError("no such file", file=name, hint="check the path of the job YAML") from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a job YAML file", file=name) from None
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}", file=name) from None
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise SpecError(f"invalid path: {exc}", file=repr(name)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; not a job spec", file=name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                        file=name, line=line, column=column, hint="save the file as UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_yaml_text(text, name)
