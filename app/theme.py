"""Fonts and the light and dark themes: one style sheet template, a colour palette per theme.

The palette is shared by the Qt style sheet and by the HTML the chat renders (message text, code highlighting,
token-origin tints), so a theme switch changes both consistently.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QApplication

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
STYLES = RESOURCES / "styles"
FONTS = RESOURCES / "fonts"
ICONS = RESOURCES / "icons"
THEMES = ("light", "dark")
UI_FONT = "DejaVu Sans"
MONO_FONT = "DejaVu Sans Mono"


class ThemeError(ValueError):
    """An unknown theme name or a broken palette file."""


@dataclass(frozen=True)
class Theme:
    """A theme's name and its colours (keys as in resources/styles/<name>.json)."""

    name: str
    colors: dict

    def __getitem__(self, key: str) -> str:
        return self.colors[key]

    def style_sheet(self) -> str:
        """The application style sheet with every @colour token filled from this palette (@icons: the icon folder)."""
        template = (STYLES / "base.qss").read_text(encoding="utf-8")

        def fill(match: re.Match) -> str:
            key = match.group(1)
            if key == "icons":
                return ICONS.as_posix()
            if key not in self.colors:
                raise ThemeError(f"base.qss uses @{key}, which {self.name}.json does not define")
            return self.colors[key]

        return re.sub(r"@([a-z_]+)", fill, template)


    def palette(self) -> QPalette:
        """A Qt palette from the theme colours, for what style sheets do not reach (dialogs, menus, selections)."""
        pal = QPalette()
        roles = {QPalette.ColorRole.Window: "window", QPalette.ColorRole.WindowText: "text",
                 QPalette.ColorRole.Base: "surface", QPalette.ColorRole.AlternateBase: "sidebar",
                 QPalette.ColorRole.Text: "text", QPalette.ColorRole.Button: "surface",
                 QPalette.ColorRole.ButtonText: "text", QPalette.ColorRole.Highlight: "selection",
                 QPalette.ColorRole.HighlightedText: "text", QPalette.ColorRole.ToolTipBase: "surface",
                 QPalette.ColorRole.ToolTipText: "text", QPalette.ColorRole.PlaceholderText: "muted",
                 QPalette.ColorRole.Link: "accent"}
        for role, key in roles.items():
            pal.setColor(role, QColor(self.colors[key]))
        return pal


def load_theme(name: str) -> Theme:
    """The palette of theme ``name`` ("light" or "dark")."""
    if name not in THEMES:
        raise ThemeError(f"unknown theme {name!r}; choose one of {', '.join(THEMES)}")
    return Theme(name, json.loads((STYLES / f"{name}.json").read_text(encoding="utf-8")))


def load_fonts() -> None:
    """Register the bundled DejaVu fonts so that text renders the same on every machine."""
    for path in sorted(FONTS.glob("*.ttf")):
        if QFontDatabase.addApplicationFont(str(path)) < 0:
            raise ThemeError(f"could not load the bundled font {path}")


def apply_theme(app: QApplication, name: str) -> Theme:
    """Use the bundled font and theme ``name`` for the whole application; returns the theme."""
    theme = load_theme(name)
    font = QFont(UI_FONT, 10)
    font.setHintingPreference(QFont.HintingPreference.PreferNoHinting)
    app.setFont(font)
    app.setStyle("Fusion")
    app.setPalette(theme.palette())
    app.setStyleSheet(theme.style_sheet())
    return theme
