"""Provides the default dark theme."""

from textual.theme import Theme

MAGNITUDE = Theme(
    name="magnitude",
    primary="#5FA8D3",
    secondary="#9D7CD8",
    accent="#F2A65A",
    warning="#E5C07B",
    error="#E06C75",
    success="#98C379",
    foreground="#D8DEE9",
    background="#14171C",
    surface="#1B1F26",
    panel="#232833",
    dark=True,
    variables={
        "footer-key-foreground": "#F2A65A",
        "block-cursor-background": "#5FA8D3",
    },
)
