"""One table of keys per screen: its bindings, its help rows and its command-palette entries come from it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType

KEY_NAMES = {"question_mark": "?", "slash": "/", "escape": "esc", "left_square_bracket": "[",
             "right_square_bracket": "]"}


@dataclass(frozen=True)
class Key:
    keys: str
    """Textual key names, comma-separated (`n,ctrl+n`); all shown in the footer when `footer` is set."""
    action: str
    """The action the keys run (`launch(True)`); empty for a help-only row (keys a widget handles)."""
    footer: str
    """Footer label; empty keeps the keys out of the footer."""
    title: str
    """Command-palette title; empty keeps the action out of the palette."""
    help: str
    """What it does, for the help screen and the palette."""
    hidden: str = ""
    """More keys for the same action, never shown in the footer (`enter` beside `l`)."""

    @property
    def shown(self) -> str:
        """The keys as the help screen and palette name them: `l / enter`, `?`."""
        names = [*self.keys.split(","), *filter(None, self.hidden.split(","))]
        return " / ".join(KEY_NAMES.get(n, n) for n in names)


def bindings(keys: tuple[Key, ...], prefix: str = "") -> list[BindingType]:
    """The screen's BINDINGS; prefix (`app.`) names where the actions live."""
    out: list[BindingType] = []
    for k in keys:
        if not k.action:
            continue
        out.append(Binding(k.keys, prefix + k.action, k.footer or k.title, show=bool(k.footer)))
        if k.hidden:
            out.append(Binding(k.hidden, prefix + k.action, k.footer or k.title, show=False))
    return out


def help_rows(keys: tuple[Key, ...], prefix: str = "") -> list[tuple[str, str]]:
    """(keys, what they do) for the help screen; prefix names the screen (`log: `)."""
    return [(k.shown, prefix + k.help) for k in keys]
