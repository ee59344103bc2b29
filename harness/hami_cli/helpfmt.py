"""The help layout every ``hami`` command shares: each option's default is shown where it has one."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelp"]


class DefaultsHelp(argparse.HelpFormatter):
    """Like argparse's ArgumentDefaultsHelpFormatter, without "(default: None)" on options that have no default
    (or whose help already says what happens without them)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text.lower()
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"
