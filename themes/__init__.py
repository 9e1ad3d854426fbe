"""Provides the app's themes, registered with Textual by the app."""

from themes.magnitude import MAGNITUDE
from themes.paper import PAPER
from themes.phosphor import PHOSPHOR

THEMES = (MAGNITUDE, PAPER, PHOSPHOR)
DEFAULT_THEME = MAGNITUDE.name
