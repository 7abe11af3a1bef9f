"""Plain-data YAML files (a release's config.yaml, a recipe): bounded in size before a byte is read, parsed by a
safe loader that also refuses anchors, aliases and explicit tags beyond the plain ones, so a small file cannot
expand into a large document (the "billion laughs") or name a type. Every error is a ValueError naming the file.
"""

from __future__ import annotations

import functools
import pathlib

MAX_YAML_BYTES = 1 << 20  # 1 MiB: a release's config.yaml and a recipe are a few KiB
# The explicit tags a file may carry (the plain types safe_load builds anyway).
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map"))


@functools.cache
def _plain_loader():
    """yaml.SafeLoader refusing anchors, aliases and other explicit tags (built on first use: yaml is lazy)."""
    import yaml  # lazy: read only with a recipe or a release's config

    class PlainLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark is not None else "?"
            where = f" (line {line})"
            if isinstance(event, yaml.AliasEvent):
                raise _Refused(f"YAML aliases are not allowed (alias *{event.anchor} at line {line})")
            if getattr(event, "anchor", None) is not None:
                raise _Refused(f"YAML aliases are not allowed (anchor &{event.anchor} at line {line})")
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!" and tag not in PLAIN_TAGS:
                raise yaml.YAMLError(f"the tag {tag!r} is not allowed{where}")
            return super().compose_node(parent, index)

        def construct_yaml_int(self, node):
            value = super().construct_yaml_int(node)
            try:  # a 5000-digit hex literal is an int Python cannot print: every message naming it would fail
                str(value)
            except ValueError as e:
                raise yaml.constructor.ConstructorError(None, None, f"an int too large ({e})",
                                                        node.start_mark) from None
            return value

    PlainLoader.add_constructor("tag:yaml.org,2002:int", PlainLoader.construct_yaml_int)
    return PlainLoader


class _Refused(Exception):
    """What the loader refuses (turned into a ValueError naming the file)."""


def load_plain_yaml(path, *, label: str = "", invalid: str = "not valid YAML", max_bytes: int = MAX_YAML_BYTES):
    """The plain data in the YAML file at `path` (its size checked against max_bytes first); a ValueError that
    starts with `label` and the path for a file too large, unreadable, not UTF-8, using anchors or aliases, or not
    YAML (`invalid` says so; a tag beyond the plain types is such an error)."""
    import yaml  # lazy: read only with a recipe or a release's config

    path = pathlib.Path(path)
    name = f"{label}{path}"
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ValueError(f"{name}: {size} bytes, more than the {max_bytes} a YAML file here may have")
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)  # the file may have grown since stat
        if len(raw) > max_bytes:
            raise ValueError(f"{name}: more than the {max_bytes} bytes a YAML file here may have")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{name}: cannot be read ({e})") from None
    try:
        return yaml.load(text, Loader=_plain_loader())  # noqa: S506 (a SafeLoader subclass)
    except _Refused as e:
        raise ValueError(f"{name}: {e}") from None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: a scalar its type cannot hold (2001-02-30, 5000 digits)
        raise ValueError(f"{name}: {invalid} ({e})") from None
    except RecursionError:
        raise ValueError(f"{name}: nested too deeply") from None
