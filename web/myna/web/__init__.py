"""The web page served at ``/`` (static package data: HTML, CSS, JS; no build step)."""
