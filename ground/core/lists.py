"""Comma-separated option values (``--suite a,b``, ``--speculative``, ``--slo``) split one way everywhere.

An empty item (``a,,b``, a trailing comma) is a one-line error, as ``--variants dense,,x`` always was: it is
almost always a typo, and skipping it silently hid the item the user meant to type there.
"""

from __future__ import annotations

from ground.core.errors import UserError


def option_items(text: str, option: str, example: str) -> list[str]:
    """The stripped items of a comma-separated option value.

    Args:
        text: the value as typed.
        option: the option's name, for the error (``--suite``).
        example: a valid value, for the error.

    Raises:
        UserError: the value or one of its items is empty.
    """
    items = [item.strip() for item in text.split(",")]
    for number, item in enumerate(items, start=1):
        if not item:
            where = "is empty" if len(items) == 1 else f"has an empty item (item {number} of {len(items)})"
            raise UserError(f"{option} {text!r} {where}: separate items by single commas, e.g. {example}")
    return items
