"""Provides a high-contrast green-on-black theme."""

from textual.theme import Theme

PHOSPHOR = Theme(
    name="magnitude-phosphor",
    primary="#33FF66",
    secondary="#2BB3A0",
    accent="#FFD23F",
    warning="#FFB000",
    error="#FF5555",
    success="#33FF66",
    foreground="#B8F5C4",
    background="#050A06",
    surface="#0A140C",
    panel="#10241A",
    dark=True,
)
