"""The config's building blocks: the strict model every section derives from,
durations written as text, and the checks shared by its fields (names,
zones, addresses, predicates)."""

from __future__ import annotations

import re
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, BeforeValidator, ConfigDict

from ..times import parse_duration

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Duration = Annotated[float, BeforeValidator(parse_duration)]


def check_identifier(value: str, *, qualified: bool = False) -> str:
    parts = value.split(".")
    if (
        (qualified and len(parts) > 2)
        or (not qualified and len(parts) > 1)
        or not all(IDENTIFIER.match(p) for p in parts)
    ):
        shape = "name or schema.name" if qualified else "column name"
        raise ValueError(
            f"{value!r} is not a plain {shape}: use letters, digits and underscores, "
            "starting with a letter or underscore"
        )
    return value


def check_zone(value: str) -> str:
    """An IANA time zone name, as zoneinfo knows it."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f'{value!r} is not an IANA time zone, e.g. "UTC" or "Europe/Paris"'
        ) from None
    return value


def check_listen(value: str) -> str:
    """HOST:PORT with both parts: ":8080" would bind every interface."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f'{value!r}: write HOST:PORT, e.g. "127.0.0.1:8080" (or "0.0.0.0:8080" to '
            "listen on every interface)"
        )
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def one_predicate(value: str | None) -> str | None:
    if value is not None and (";" in value or "--" in value or "/*" in value):
        raise ValueError("must be one SQL predicate without ';' or comments")
    return value
