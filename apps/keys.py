"""Keyboard stepping for the dashboard: the arrow keys move the player one step, Home / End to the
first / last step, anywhere on the page except while typing in a field (where the keys move the
cursor, and a focused slider already steps itself)."""
from __future__ import annotations

from panel.custom import JSComponent

MOVES = {"ArrowRight": 1, "ArrowLeft": -1, "Home": "first", "End": "last"}


class StepKeys(JSComponent):
    """Invisible; sends {"move": 1 | -1 | "first" | "last"} to `on_move` for each key press."""

    _esm = """
    const MOVES = %s;
    export function render({ model }) {
      const onkey = (e) => {
        const t = e.composedPath()[0];
        if (e.altKey || e.ctrlKey || e.metaKey) return;
        if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT' || t.isContentEditable)) return;
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
