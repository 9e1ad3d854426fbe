"""Provides the light theme."""

from textual.theme import Theme

PAPER = Theme(
    name="magnitude-paper",
    primary="#1F5F99",
    secondary="#6A4C93",
    accent="#B5541B",
    warning="#9A6700",
    error="#B42318",
    success="#2E7D32",
    foreground="#1E2328",
    background="#F7F5F0",
    surface="#FFFFFF",
    panel="#E9E5DC",
    dark=False,
    variables={
        "footer-key-foreground": "#B5541B",
    },
)
