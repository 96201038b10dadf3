"""Keyboard stepping for the dashboard: the arrow keys move the player one step, Home / End to the
first / last step, anywhere on the page except while typing in a field (where the keys move the
cursor) or on a focused slider (which steps itself: the player's slider would move two steps, any
other slider would move the player as well as itself)."""
from __future__ import annotations

from panel.custom import JSComponent

# Page Down / Page Up: what a presenter's clicker sends
MOVES = {"ArrowRight": 1, "ArrowLeft": -1, "PageDown": 1, "PageUp": -1, "Home": "first", "End": "last"}


class StepKeys(JSComponent):
    """Invisible; sends {"move": 1 | -1 | "first" | "last"} to `on_move` for each key press."""

    _esm = """
    const MOVES = %s;
    export function render({ model }) {
      const onkey = (e) => {
        const t = e.composedPath()[0];
        if (e.altKey || e.ctrlKey || e.metaKey) return;
        if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT' || t.isContentEditable)) return;
        // a focused slider (the player's, a temperature's) steps itself: the page must not step too
        if (e.composedPath().some((n) => n.getAttribute && (n.getAttribute('role') === 'slider'
            || (n.classList && (n.classList.contains('noUi-target') || n.classList.contains('noUi-handle')))))) return;
        if (!(e.key in MOVES)) return;
        e.preventDefault();
        model.send_msg({ move: MOVES[e.key] });
      };
      document.addEventListener('keydown', onkey);
      model.on('remove', () => document.removeEventListener('keydown', onkey));
    }
    """ % str(MOVES).replace("'", '"')

    def __init__(self, on_move, **params):
        super().__init__(height=0, width=0, margin=0, **params)
        self._on_move = on_move

    def _handle_msg(self, msg) -> None:
        if isinstance(msg, dict) and msg.get("move") in MOVES.values():
            self._on_move(msg["move"])
