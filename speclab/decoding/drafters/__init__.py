"""Drafters: everything that fills the `propose / observe` slot of the draft/verify engine."""
